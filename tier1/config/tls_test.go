package config

import (
	"strings"
	"testing"

	loader "github.com/infergate/infergate/shared/config"
)

// The TLS keys are checked without reading files; each error names its
// key.
func TestValidateTLS(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string // substrings of the error; none: valid
	}{
		{"all off", "", nil},
		{"api tls", "tls: {cert_file: a.crt, key_file: a.key}\n", nil},
		{"mutual tls", "tls: {cert_file: a.crt, key_file: a.key, client_ca_file: ca.crt}\n", nil},
		{"api key missing", "tls: {cert_file: a.crt}\n", []string{"tls: cert_file and key_file must both be set"}},
		{"metrics client_auth without ca", "metrics_tls: {cert_file: a.crt, key_file: a.key, client_auth: require}\n",
			[]string{"metrics_tls.client_auth"}},
		{"ext_proc bad version", "ext_proc_tls: {cert_file: a.crt, key_file: a.key, min_version: \"1.1\"}\n",
			[]string{"ext_proc_tls.min_version"}},
		{"ext_proc ca alone", "ext_proc_tls: {client_ca_file: ca.crt}\n", []string{"ext_proc_tls: cert_file and key_file are required"}},
		{"upstream https", "upstream: {scheme: https}\n", nil},
		{"upstream https with ca", "upstream: {scheme: https, tls: {ca_file: pods.crt, cert_file: c.crt, key_file: c.key}}\n", nil},
		{"upstream bad scheme", "upstream: {scheme: HTTPS}\n", []string{`upstream.scheme "HTTPS"`}},
		{"upstream tls without https", "upstream: {tls: {ca_file: pods.crt}}\n", []string{"upstream.tls is set but upstream.scheme is http"}},
		{"upstream half client cert", "upstream: {scheme: https, tls: {cert_file: c.crt}}\n", []string{"upstream.tls: cert_file and key_file"}},
		{"consul http with tls", "tls: {cert_file: a.crt, key_file: a.key}\nconsul: {address: \"127.0.0.1:8500\", scheme: http}\n",
			[]string{"consul.scheme is http but tls"}},
		{"consul https with tls", "tls: {cert_file: a.crt, key_file: a.key}\nconsul: {address: \"127.0.0.1:8500\", scheme: https}\n", nil},
		{"consul bad scheme", "consul: {address: \"127.0.0.1:8500\", scheme: tcp}\n", []string{`consul.scheme "tcp"`}},
		{"several at once", "tls: {key_file: a.key}\nupstream: {scheme: ftp}\n",
			[]string{"tls: cert_file and key_file must both be set", `upstream.scheme "ftp"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			err := loader.Decode("t.yaml", []byte(base+tt.yaml), &c)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestUpstreamSchemeDefault(t *testing.T) {
	var c Config
	if err := loader.Decode("t.yaml", []byte(base), &c); err != nil {
		t.Fatal(err)
	}
	if c.Upstream.Scheme != "http" {
		t.Errorf("upstream.scheme default %q, want http", c.Upstream.Scheme)
	}
}
