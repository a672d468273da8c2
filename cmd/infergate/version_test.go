package main

import (
	"bytes"
	"context"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestReadBuildInfo(t *testing.T) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	vcs := func(rev, modified, when string) []debug.BuildSetting {
		return []debug.BuildSetting{
			{Key: "-trimpath", Value: "true"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: rev},
			{Key: "vcs.time", Value: when},
			{Key: "vcs.modified", Value: modified},
		}
	}
	tests := []struct {
		name            string
		bi              *debug.BuildInfo
		ok              bool
		stampedVersion  string
		stampedRevision string
		want            buildInfo
	}{
		{
			name: "tagged build, no stamps",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.7", Main: debug.Module{Path: "github.com/infergate/infergate", Version: "v0.1.0"}, Settings: vcs("0123abcd", "false", "2026-01-02T03:04:05Z")},
			ok:   true,
			want: buildInfo{version: "v0.1.0", module: "v0.1.0", revision: "0123abcd", modified: "false", committed: "2026-01-02T03:04:05Z", goVersion: "go1.26.7", platform: platform},
		},
		{
			name:            "image build: stamped version wins over the pseudo-version, VCS revision wins over the stamp",
			bi:              &debug.BuildInfo{GoVersion: "go1.26.7", Main: debug.Module{Version: "v0.0.0-20260102030405-0123abcd0123+dirty"}, Settings: vcs("0123abcd0123", "true", "2026-01-02T03:04:05Z")},
			ok:              true,
			stampedVersion:  "0.1.0",
			stampedRevision: "ffffffff",
			want:            buildInfo{version: "0.1.0", module: "v0.0.0-20260102030405-0123abcd0123+dirty", revision: "0123abcd0123", modified: "true", committed: "2026-01-02T03:04:05Z", goVersion: "go1.26.7", platform: platform},
		},
		{
			name:            "docker build without .git: (devel) and no VCS settings, stamps fill in",
			bi:              &debug.BuildInfo{GoVersion: "go1.26.7", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "CGO_ENABLED", Value: "0"}}},
			ok:              true,
			stampedVersion:  "0.1.0",
			stampedRevision: "feedface",
			want:            buildInfo{version: "0.1.0", module: "(devel)", revision: "feedface", modified: unknown, committed: unknown, goVersion: "go1.26.7", platform: platform},
		},
		{
			name: "devel build, no stamps",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.7", Main: debug.Module{Version: "(devel)"}},
			ok:   true,
			want: buildInfo{version: "(devel)", module: "(devel)", revision: unknown, modified: unknown, committed: unknown, goVersion: "go1.26.7", platform: platform},
		},
		{
			name: "no build info at all",
			ok:   false,
			want: buildInfo{version: "(devel)", module: unknown, revision: unknown, modified: unknown, committed: unknown, goVersion: runtime.Version(), platform: platform},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := readBuildInfo(tt.bi, tt.ok, tt.stampedVersion, tt.stampedRevision)
			if got != tt.want {
				t.Errorf("readBuildInfo:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestBuildInfoWrite(t *testing.T) {
	var out bytes.Buffer
	buildInfo{version: "0.1.0", module: "(devel)", revision: "0123abcd", modified: "false", committed: "2026-01-02T03:04:05Z", goVersion: "go1.26.7", platform: "linux/arm64"}.write(&out)
	want := `infergate 0.1.0
module:    (devel)
revision:  0123abcd
modified:  false
committed: 2026-01-02T03:04:05Z
go:        go1.26.7
platform:  linux/arm64
`
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestVersionCommand runs the subcommand the way a user does, through run.
func TestVersionCommand(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  []string // substrings of stdout
		wantErr  string   // substring of stderr
	}{
		{name: "subcommand", args: []string{"version"}, wantCode: 0, wantOut: []string{"infergate ", "\nrevision:  ", "\ngo:        " + runtime.Version(), "\nplatform:  " + runtime.GOOS + "/" + runtime.GOARCH}},
		{name: "--version", args: []string{"--version"}, wantCode: 0, wantOut: []string{"infergate ", "\nplatform:  "}},
		{name: "-version", args: []string{"-version"}, wantCode: 0, wantOut: []string{"infergate "}},
		{name: "help", args: []string{"version", "--help"}, wantCode: 0, wantErr: "Usage: infergate version"},
		{name: "stray argument", args: []string{"version", "extra"}, wantCode: 1, wantErr: `unexpected argument "extra"`},
		{name: "unknown flag", args: []string{"version", "--json"}, wantCode: 1, wantErr: "-json"},
		{name: "listed in usage", args: []string{"help"}, wantCode: 0, wantOut: []string{"  version   print the version and build information"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.wantCode {
				t.Fatalf("exit code %d, want %d; stderr: %s", code, tt.wantCode, stderr.String())
			}
			for _, s := range tt.wantOut {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("stderr lacks %q:\n%s", tt.wantErr, stderr.String())
			}
		})
	}
}

func TestRunVersionPrintsStamps(t *testing.T) {
	// The link-time variables are what the image builds set; check that
	// runVersion reads them (they are empty in a test binary otherwise).
	oldV, oldR := version, revision
	version, revision = "9.9.9-test", "stamped-rev"
	t.Cleanup(func() { version, revision = oldV, oldR })
	var out bytes.Buffer
	if err := runVersion(context.Background(), nil, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "infergate 9.9.9-test\n") {
		t.Errorf("output does not lead with the stamped version:\n%s", out.String())
	}
}
