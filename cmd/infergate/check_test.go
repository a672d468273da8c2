package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/infergate/infergate/internal/testpki"
)

const checkTier1 = `auth: {tokens: [t]}
pools:
  - {name: llama, model: m}
pods:
  - {name: p0, address: "127.0.0.1:8101", pool: llama}
`

const checkTier2 = `region: east
clusters:
  - {name: a, region: east, address: "http://127.0.0.1:9001", models: [m]}
tenants:
  - {id: acme}
`

// goTypeName matches what no message may show: Go's names for types.
var goTypeName = regexp.MustCompile(`\b(u?int(8|16|32|64)?|float(32|64)|time\.Duration|bool|struct|\[\][a-z]+|map\[[a-z]+\][a-z]+)\b|[a-z0-9]+\.[A-Z][A-Za-z]+(Config|Cluster|Tenant|Key)\b|!!(str|int|map|seq)`)

// TestCheckCommand feeds `infergate check` (the command as main runs it,
// in process) kinds of bad configuration: each must exit non-zero and
// list every problem at file:line:column with the key's path, in words
// (no Go type names), and the wanted problems must be among them.
func TestCheckCommand(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "check")
	good := testpki.Write(t, dir, "good", ca.Issue(t, testpki.LeafOptions{}), ca)
	other := testpki.Write(t, dir, "other", ca.Issue(t, testpki.LeafOptions{}), nil)
	r := strings.NewReplacer("GOODCERT", good.Cert, "GOODKEY", good.Key, "OTHERKEY", other.Key, "DIR", dir)

	tests := []struct {
		name string
		yaml string
		want []string // each in some problem line, after the file name
	}{
		{"tier1: misspelt key", checkTier1 + "scrape:\n  intervall: 1s\n",
			[]string{`:7:3: scrape.intervall: unknown key "intervall"; did you mean "interval"?`}},
		{"tier1: key in the wrong section", checkTier1 + "max_attempts: 2\n",
			[]string{`:6:1: max_attempts: unknown key "max_attempts" here; did you mean retry.max_attempts?`}},
		{"tier1: not a number", checkTier1 + "scrape: {unready_after: abc}\n",
			[]string{`:6:25: scrape.unready_after: want a whole number, got "abc"`}},
		{"tier1: duplicate pod address", checkTier1 + "  - {name: p1, address: \"127.0.0.1:8101\", pool: llama}\n",
			[]string{`:6:16: pods[1].address: "127.0.0.1:8101" is also pods[0]'s address (p0)`}},
		{"tier1: duplicate pod name", checkTier1 + "  - {name: p0, address: \"127.0.0.1:8102\", pool: llama}\n",
			[]string{`:6:6: pods[1].name: duplicate pod "p0" (also pods[0])`}},
		{"tier1: zero attempts", checkTier1 + "retry:\n  max_attempts: 0\n",
			[]string{`:7:17: retry.max_attempts: want a whole number ≥ 1, got 0`}},
		{"tier1: unknown scorer and negative weight", checkTier1 + "scheduler:\n  scorers:\n    - {name: queue, weight: -1}\n    - {name: magic, weight: 1}\n",
			[]string{`:8:7: scheduler.scorers[0]: scorer "queue": weight -1 is negative`, `:9:7: scheduler.scorers[1]: unknown scorer "magic" (known: `}},
		{"tier1: negative duration", checkTier1 + "timeouts: {connect: -1s}\n",
			[]string{`:6:12: timeouts.connect -1s is negative`}},
		{"tier1: duration without a unit", checkTier1 + "timeouts: {connect: 5}\n",
			[]string{`:6:21: timeouts.connect: want a duration with a unit such as 5s, got 5`}},
		{"tier1: listeners clash", checkTier1 + "listen: :9000\nmetrics_listen: 0.0.0.0:9000\n",
			[]string{`:7:1: metrics_listen: "0.0.0.0:9000" clashes with listen (":9000")`}},
		{"tier1: TLS block half set", checkTier1 + "tls: {cert_file: GOODCERT}\n",
			[]string{`:6:1: tls: cert_file and key_file must both be set`}},
		{"tier1: unreadable TLS file", checkTier1 + "tls: {cert_file: GOODCERT, key_file: DIR/missing.key}\n",
			[]string{`tls.key_file: cannot read DIR/missing.key: no such file or directory`}},
		{"tier1: key does not match its certificate", checkTier1 + "tls: {cert_file: GOODCERT, key_file: OTHERKEY}\n",
			[]string{`:6:1: tls: key pair `}},
		{"tier1: unreadable token file", checkTier1 + "upstream: {token_file: DIR/none}\n",
			[]string{`:6:12: upstream.token_file: cannot read DIR/none: no such file or directory`}},
		{"tier2: tenant pinned to a region no cluster is in", checkTier2 + "  - {id: bank, policy: region-pinned, region: eu-west}\n",
			[]string{`:6:39: tenants[1].region: "eu-west" is not the region of any cluster (regions: east)`}},
		{"tier2: limits for a model no cluster serves", checkTier2 + "  - {id: bank, model_limits: {meta-llama/Llama-3.1-8B: {rpm: 5}}}\n",
			[]string{`:6:31: tenants[1].model_limits["meta-llama/Llama-3.1-8B"]: no cluster serves model "meta-llama/Llama-3.1-8B" (served: m)`}},
		{"tier2: zero attempts", checkTier2 + "routing: {max_attempts: 0}\n",
			[]string{`:6:25: routing.max_attempts: want a whole number ≥ 1, got 0`}},
		{"tier2: negative count for a whole number ≥ 0", checkTier2 + "routing:\n  breaker: {consecutive_failures: -1}\n",
			[]string{`:7:35: routing.breaker.consecutive_failures: want a whole number ≥ 0, got "-1"`}},
		{"tier2: negative redis timeout", checkTier2 + "limits: {redis_timeout: -50ms}\n",
			[]string{`:6:10: limits.redis_timeout: -50ms is negative (leave it out for the default)`}},
		{"tier2: bad tenant limit", checkTier2 + "  - {id: bank, limits: {rpm: -5}}\n",
			[]string{`:6:25: tenants[1].limits.rpm: must be >= 0`}},
		{"tier2: key for an unknown tenant", checkTier2 + "keys:\n  - {tenant: acmee, key: sk-1}\n",
			[]string{`:7:6: keys[0].tenant: unknown tenant "acmee" (tenants: acme)`}},
		{"tier2: misspelt top-level key", checkTier2 + "tenant: []\n",
			[]string{`:6:1: tenant: unknown key "tenant"; did you mean "tenants"?`}},
		{"tier2: static cluster without a URL", checkTier2 + "  - {id: b}\nclusters_extra: 1\n",
			[]string{`:7:1: clusters_extra: unknown key`}},
		{"tier2: cluster address", strings.Replace(checkTier2, `"http://127.0.0.1:9001"`, `"127.0.0.1:9001"`, 1),
			[]string{`:3:29: clusters[0].address: "127.0.0.1:9001": want an http(s) base URL`}},
		{"tier2: listeners clash", checkTier2 + "admin: {listen: 127.0.0.1:8080, token: x}\n",
			[]string{`:6:9: admin.listen: "127.0.0.1:8080" clashes with listen ("127.0.0.1:8080")`}},
		{"tier2: every problem at once", checkTier2 + "routing: {max_attempts: 0, spill_threshold: 3}\nredis: {db: -1}\n",
			[]string{`routing.max_attempts`, `routing.spill_threshold: want a share in (0, 1], got 3`, `redis.addresses: required`, `redis.db: -1 is negative`}},
		{"YAML syntax", "region: east\n  clusters: []\n", []string{`:2: not valid YAML: mapping values are not allowed`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "c.yaml")
			if err := os.WriteFile(path, []byte(r.Replace(tt.yaml)), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"check", "--config", path}
			if strings.HasPrefix(tt.name, "YAML") {
				args = append(args, "--tier", "tier2")
			}
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code == 0 {
				t.Fatalf("exit 0 for a bad file; stdout %q", stdout.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			summary := lines[len(lines)-1]
			if !strings.HasPrefix(summary, "infergate check: "+path+": ") {
				t.Errorf("summary %q", summary)
			}
			problems := lines[:len(lines)-1]
			if len(problems) == 0 {
				t.Fatalf("no problem listed:\n%s", stderr.String())
			}
			for _, p := range problems {
				if !regexp.MustCompile(`^` + regexp.QuoteMeta(path) + `:\d+(:\d+)?: `).MatchString(p) {
					t.Errorf("problem without file:line: %q", p)
				}
				if m := goTypeName.FindString(strings.TrimPrefix(p, path)); m != "" {
					t.Errorf("problem names a Go type (%s): %q", m, p)
				}
			}
			for _, w := range tt.want {
				w = r.Replace(w)
				found := false
				for _, p := range problems {
					found = found || strings.Contains(strings.TrimPrefix(p, path), w)
				}
				if !found {
					t.Errorf("no problem contains %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

func TestCheckCommandValid(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "check")
	files := testpki.Write(t, dir, "srv", ca.Issue(t, testpki.LeafOptions{}), ca)
	for _, tc := range []struct {
		name, yaml, tier, want string
	}{
		{"tier1", checkTier1, "", "ok (tier1)"},
		{"tier1 with TLS", checkTier1 + "tls: {cert_file: " + files.Cert + ", key_file: " + files.Key + ", client_ca_file: " + files.CA + "}\n", "", "ok (tier1)"},
		{"tier2", checkTier2, "", "ok (tier2)"},
		{"told", "listen: 127.0.0.1:1\nauth: {disabled: true}\n", "tier1", "ok (tier1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "c.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"check", "--config", path}
			if tc.tier != "" {
				args = append(args, "--tier", tc.tier)
			}
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if got := strings.TrimSpace(stdout.String()); got != path+": "+tc.want {
				t.Errorf("stdout %q, want %q", got, path+": "+tc.want)
			}
		})
	}
}

// TestCommandsRefuseExtraArguments: a word after the flags (a file named
// without --config, or flags the flag package would then skip) is an
// error, not ignored.
func TestCommandsRefuseExtraArguments(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(checkTier1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"tier1", "tier2", "check"} {
		var stdout, stderr bytes.Buffer
		code := run([]string{cmd, "--config", path, "extra", "--listen", "127.0.0.1:1"}, &stdout, &stderr)
		if code == 0 || !strings.Contains(stderr.String(), `unexpected argument "extra"`) {
			t.Errorf("%s with an extra argument: exit %d, stderr %q", cmd, code, stderr.String())
		}
	}
}

// TestCheckCannotTellTier: a file with only keys both tiers have.
func TestCheckCannotTellTier(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check", "--config", path}, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "pass --tier tier1 or --tier tier2") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

// TestStartupReportsLikeCheck: tier1 and tier2 refuse a bad file at start
// with the very lines check prints, before opening any listener.
func TestStartupReportsLikeCheck(t *testing.T) {
	dir := t.TempDir()
	for tier, yaml := range map[string]string{
		"tier1": checkTier1 + "retry: {max_attempts: 0}\nscrape: {intervall: 1s}\n",
		"tier2": checkTier2 + "  - {id: bank, region: mars}\nrouting: {max_attempts: 0}\n",
	} {
		path := filepath.Join(dir, tier+".yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		var cout, cerr bytes.Buffer
		run([]string{"check", "--config", path}, &cout, &cerr)
		lines := strings.Split(strings.TrimSpace(cerr.String()), "\n")
		problems := lines[:len(lines)-1]
		if len(problems) != 2 {
			t.Fatalf("%s: check found %d problems, want 2:\n%s", tier, len(problems), cerr.String())
		}
		var sout, serr bytes.Buffer
		runFn := runTier1
		if tier == "tier2" {
			runFn = runTier2
		}
		err := runFn(context.Background(), []string{"--config", path, "--listen", "127.0.0.1:0"}, &sout, &serr)
		if err == nil {
			t.Fatalf("%s started with a bad file", tier)
		}
		for _, p := range problems {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("%s at start: %v\nlacks check's line %q", tier, err, p)
			}
		}
	}
}
