package bench

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/workload"
	"github.com/infergate/infergate/internal/admissiontest"
	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
)

// The benchmark's router takes the shared table's decisions (tier1/gateway
// tests the same table against the gateway), so for the same snapshot the
// benchmark admits, queues and sheds as Tier 1 does.
func TestArrivalDecisionsMatchSharedTable(t *testing.T) {
	f := scenario.Fleet{Model: "llama-3.1-8b", Pods: []scenario.PodGroup{{GPU: "h100", Count: 2}}}
	f.SetDefaults()
	pol := mustPolicy(t, PolicyInfergate)
	for _, tc := range admissiontest.Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			st := workload.Stream{Duration: time.Second, Requests: []workload.Request{
				{ID: 1, PromptTokens: 100, OutputTokens: 10, Priority: tc.Priority, Sheddable: tc.Sheddable},
			}}
			prof := pol.Profile.Clone()
			prof.Saturation.PrefillWait = tc.PrefillWait
			prof.Saturation.SheddableWait = tc.SheddableWait
			p := pol
			p.Profile = &prof
			s, err := newSim(context.Background(), Setup{Name: "t", Fleet: f}, p, 1, st, Options{})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, v := range s.views {
				names = append(names, v.Name)
			}
			defer tc.Prime(s.tracker, names)()
			now := time.Second
			for _, p := range s.pods {
				p.last = picker.Metrics{Waiting: tc.Waiting, KVUsage: tc.KV, HasKV: true}
				p.lastScrape = now
			}
			if tc.Ahead {
				// It waits because a request like the newcomer's, but not
				// sheddable, was held at the last look.
				s.queue.Push(tc.AheadPrio, 99)
				ahead := *s.states[0].preq
				ahead.Sheddable, ahead.Priority = false, tc.AheadPrio
				s.pass.Held(s.sched.HoldKey(&ahead))
			}
			if got := s.arrival(now, 0).Action; got != tc.Want {
				t.Errorf("decision %v, want %v", got, tc.Want)
			}
		})
	}
}

// By default (and with InputsProduction) the benchmark builds the
// router's input from generated request text with admission.Prompt, the
// function Tier 1's proxy calls on the prompt text (tier1/gateway's
// TestRouteBuildsInputWithAdmissionPrompt checks the proxy side on the
// same function); no field comes from the engine. The engine keeps its own
// token-level block hashes.
func TestProductionInputsUseAdmissionPrompt(t *testing.T) {
	f := scenario.Fleet{Model: "llama-3.1-8b", Pods: []scenario.PodGroup{{GPU: "h100", Count: 1}}}
	f.SetDefaults()
	w := workload.Request{ID: 3, PromptTokens: 700, BlockHashes: workload.HashSegments([]workload.Segment{{Key: 5, Tokens: 700}}), OutputTokens: 5}
	st := workload.Stream{Duration: time.Second, Requests: []workload.Request{w}}
	for _, opts := range []Options{{}, {Inputs: InputsProduction}} {
		s, err := newSim(context.Background(), Setup{Name: "t", Fleet: f}, mustPolicy(t, PolicyInfergate), 1, st, opts)
		if err != nil {
			t.Fatal(err)
		}
		got := s.states[0].preq
		want := &picker.Request{Model: "llama-3.1-8b"}
		admission.Prompt(want, "", workload.AppendText(nil, &w))
		if !slices.Equal(got.BlockHashes, want.BlockHashes) || got.PromptTokens != want.PromptTokens || len(want.BlockHashes) == 0 {
			t.Fatalf("inputs %q: bench input %d tokens %d hashes, admission.Prompt %d tokens %d hashes", opts.Inputs, got.PromptTokens, len(got.BlockHashes), want.PromptTokens, len(want.BlockHashes))
		}
		if slices.Equal(got.BlockHashes, w.BlockHashes[:len(got.BlockHashes)]) {
			t.Fatal("scheduling input holds the engine's block hashes")
		}
	}
	// The oracle keeps the engine's own counts and every hash.
	eng, _, err := schedInput(&w, "llama-3.1-8b", 0, Options{Inputs: InputsEngine}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if eng.PromptTokens != 700 || !slices.Equal(eng.BlockHashes, w.BlockHashes) {
		t.Fatalf("engine inputs: %d tokens %d hashes", eng.PromptTokens, len(eng.BlockHashes))
	}
	if _, _, err := schedInput(&w, "m", 0, Options{Inputs: InputsProduction}, nil); err == nil {
		t.Error("production inputs without text accepted")
	}
}

// Sheddable requests are shed at once under saturation and critical ones
// go ahead of standard ones, in a whole run through the admission code.
func TestPriorityScenarioShedsAndPrioritizes(t *testing.T) {
	sc, err := scenario.Get("priority-mix-8b")
	if err != nil {
		t.Fatal(err)
	}
	st := sc.Stream(1)
	st.Requests = slices.DeleteFunc(st.Requests, func(r workload.Request) bool { return r.Arrival > 60*time.Second })
	st.Duration = 60 * time.Second
	run, err := Run(context.Background(), Setup{Name: sc.Name, Fleet: sc.Fleet}, mustPolicy(t, PolicyGIEDefault), 1, st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var shed, crit int
	for _, r := range st.Requests {
		if r.Sheddable {
			shed++
		}
		if r.Priority > 0 {
			crit++
		}
	}
	if shed == 0 || crit == 0 {
		t.Fatalf("scenario has %d sheddable, %d critical requests", shed, crit)
	}
	if run.Shed == 0 || run.Shed > shed {
		t.Errorf("shed %d of %d sheddable requests", run.Shed, shed)
	}
	if run.Completed+run.Failed+run.Shed != run.Requests {
		t.Errorf("completed %d + failed %d + shed %d != %d", run.Completed, run.Failed, run.Shed, run.Requests)
	}
}

// A conversation's turns carry its session key (what a chat client sends
// as x-session-id or prompt_cache_key); requests outside a conversation
// carry none.
func TestSchedInputSession(t *testing.T) {
	for _, tc := range []struct {
		session int
		want    string
	}{{-1, ""}, {0, "conv-0"}, {42, "conv-42"}} {
		w := workload.Request{ID: 1, PromptTokens: 64, OutputTokens: 1, Session: tc.session}
		for _, in := range []string{InputsEngine, InputsProduction} {
			pr, _, err := schedInput(&w, "m", 0, Options{Inputs: in, Text: workload.AppendText}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if pr.Session != tc.want {
				t.Errorf("session %d, inputs %s: key %q, want %q", tc.session, in, pr.Session, tc.want)
			}
		}
	}
	// Only the conversation generator sets sessions.
	for _, name := range []string{"shared-prefix-8b", "multi-turn-chat"} {
		sc, err := scenario.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		with := 0
		for _, r := range sc.Stream(1).Requests {
			if r.Session >= 0 {
				with++
			}
		}
		if (with > 0) != (name == "multi-turn-chat") {
			t.Errorf("%s: %d requests with a session", name, with)
		}
	}
}
