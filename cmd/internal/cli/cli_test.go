package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestProgramRun(t *testing.T) {
	var got []string // the arguments each command was called with
	cmd := func(err error) Command {
		return Command{Summary: "does a thing", Run: func(_ context.Context, args []string, stdout, _ io.Writer) error {
			got = args
			fmt.Fprintln(stdout, "ran")
			return err
		}}
	}
	p := Program{Name: "prog", Title: "a test program", Commands: map[string]Command{
		"ok":         cmd(nil),
		"fails":      cmd(errors.New("it broke")),
		"help-asked": cmd(flag.ErrHelp),
		"a-long-one": cmd(nil),
	}}
	withVersion := p
	withVersion.Commands = map[string]Command{"version": cmd(nil)}

	tests := []struct {
		name     string
		prog     Program
		args     []string
		wantCode int
		wantOut  string // substring of stdout
		wantErr  string // substring of stderr
		wantArgs []string
	}{
		{name: "no arguments", prog: p, args: nil, wantCode: 2, wantOut: "Usage: prog <command>"},
		{name: "help", prog: p, args: []string{"help"}, wantCode: 0, wantOut: "  a-long-one does a thing\n  fails      does a thing\n"},
		{name: "command", prog: p, args: []string{"ok", "--x", "1"}, wantCode: 0, wantOut: "ran", wantArgs: []string{"--x", "1"}},
		{name: "failing command", prog: p, args: []string{"fails"}, wantCode: 1, wantErr: "prog fails: it broke\n"},
		{name: "command help", prog: p, args: []string{"help-asked", "--help"}, wantCode: 0, wantArgs: []string{"--help"}},
		{name: "unknown command", prog: p, args: []string{"nope"}, wantCode: 2, wantErr: `prog: unknown command "nope"`},
		// --version is the version command only where there is one.
		{name: "--version without version", prog: p, args: []string{"--version"}, wantCode: 2, wantErr: `unknown command "--version"`},
		{name: "--version", prog: withVersion, args: []string{"--version", "a"}, wantCode: 0, wantOut: "ran", wantArgs: []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got = nil
			var stdout, stderr bytes.Buffer
			if code := tt.prog.Run(tt.args, &stdout, &stderr); code != tt.wantCode {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantOut) {
				t.Errorf("stdout lacks %q:\n%s", tt.wantOut, stdout.String())
			}
			if !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("stderr lacks %q:\n%s", tt.wantErr, stderr.String())
			}
			if strings.Join(got, " ") != strings.Join(tt.wantArgs, " ") {
				t.Errorf("command got arguments %q, want %q", got, tt.wantArgs)
			}
		})
	}
}

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewLogger(&buf, "warn", true)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", "v")
	if out := buf.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
		t.Errorf("JSON logger at warn wrote:\n%s", out)
	}
	buf.Reset()
	log, err = NewLogger(&buf, "debug", false)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("text", "k", "v")
	if out := buf.String(); !strings.Contains(out, "msg=text k=v") {
		t.Errorf("text logger wrote:\n%s", out)
	}
	if _, err := NewLogger(&buf, "loud", false); err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Errorf("bad level: err %v, want it to name --log-level", err)
	}
}
