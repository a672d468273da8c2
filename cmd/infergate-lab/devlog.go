package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// holdHandler keeps the log records of the local stack's start instead of
// printing them: a dozen components starting at once would otherwise print
// their warnings (an engine's missing metric, tenants in memory) in a flood
// above the banner. The banner summarises the held warnings in one block;
// if the start fails they are printed as they came, since they may say why.
// After release every record goes straight to the next handler.
type holdHandler struct {
	next  slog.Handler
	attrs []slog.Attr // added with WithAttrs, for the summary
	s     *holdState
}

type holdState struct {
	mu      sync.Mutex
	holding bool
	held    []heldRecord
}

type heldRecord struct {
	r     slog.Record
	h     slog.Handler // the handler, with its attributes, to replay to
	attrs []slog.Attr
}

func newHoldHandler(next slog.Handler) *holdHandler {
	return &holdHandler{next: next, s: &holdState{holding: true}}
}

func (h *holdHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *holdHandler) Handle(ctx context.Context, r slog.Record) error {
	h.s.mu.Lock()
	if h.s.holding {
		h.s.held = append(h.s.held, heldRecord{r: r.Clone(), h: h.next, attrs: h.attrs})
		h.s.mu.Unlock()
		return nil
	}
	h.s.mu.Unlock()
	return h.next.Handle(ctx, r)
}

func (h *holdHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &holdHandler{next: h.next.WithAttrs(as), attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], as...), s: h.s}
}

func (h *holdHandler) WithGroup(name string) slog.Handler {
	return &holdHandler{next: h.next.WithGroup(name), attrs: h.attrs, s: h.s}
}

// release stops holding and returns what was held; replay also prints it.
func (h *holdHandler) release(ctx context.Context, replay bool) []heldRecord {
	h.s.mu.Lock()
	held := h.s.held
	h.s.holding, h.s.held = false, nil
	h.s.mu.Unlock()
	if replay {
		for _, hr := range held {
			_ = hr.h.Handle(ctx, hr.r)
		}
	}
	return held
}

// summary is one line per held record at level min or above: who said it
// (cluster and component), the message, then its other attributes.
func summary(held []heldRecord, min slog.Level) []string {
	var out []string
	for _, hr := range held {
		if hr.r.Level < min {
			continue
		}
		var who, rest []string
		add := func(a slog.Attr) {
			switch a.Key {
			case "cluster", "component":
				who = append(who, a.Value.String())
			default:
				rest = append(rest, a.Key+"="+a.Value.String())
			}
		}
		for _, a := range hr.attrs {
			add(a)
		}
		hr.r.Attrs(func(a slog.Attr) bool { add(a); return true })
		line := fmt.Sprintf("%s %s: %s", hr.r.Level, strings.Join(who, " "), hr.r.Message)
		if len(rest) > 0 {
			line += " (" + strings.Join(rest, " ") + ")"
		}
		out = append(out, line)
	}
	return out
}
