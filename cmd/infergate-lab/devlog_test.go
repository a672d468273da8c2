package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

func TestHoldHandler(t *testing.T) {
	ctx := context.Background()
	for _, replay := range []bool{false, true} {
		var out bytes.Buffer
		h := newHoldHandler(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}))
		log := slog.New(h).With("cluster", "c1").With("component", "tier1")
		log.Info("listening", "addr", "x")
		log.Warn("pod lacks a metric", "pod", "p0")
		log.Debug("below the level")
		if out.Len() != 0 {
			t.Fatalf("printed while holding: %s", out.String())
		}
		held := h.release(ctx, replay)
		if len(held) != 2 {
			t.Fatalf("held %d records, want 2 (debug is below the level)", len(held))
		}
		got := summary(held, slog.LevelWarn)
		if want := "WARN c1 tier1: pod lacks a metric (pod=p0)"; len(got) != 1 || got[0] != want {
			t.Errorf("summary %q, want [%q]", got, want)
		}
		printed := out.String()
		if replay != strings.Contains(printed, "pod lacks a metric") || replay != strings.Contains(printed, "cluster=c1") {
			t.Errorf("replay %v printed %q", replay, printed)
		}
		out.Reset()
		log.Warn("after release")
		if !strings.Contains(out.String(), "after release") {
			t.Errorf("after release: printed %q", out.String())
		}
	}
}

func TestDevPorts(t *testing.T) {
	p := devPorts{base: 18000}
	if a, m := p.tier1(3); p.addr(0) != "127.0.0.1:18000" || p.addr(2) != "127.0.0.1:18002" || a != "127.0.0.1:18016" || m != "127.0.0.1:18017" {
		t.Errorf("layout: %s %s %s %s", p.addr(0), p.addr(2), a, m)
	}
	if a, m := (devPorts{}).tier1(1); a != "127.0.0.1:0" || m != "127.0.0.1:0" {
		t.Errorf("base 0: %s %s", a, m)
	}
}
