package register_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier1/register"
)

// TestRegister registers a Tier 1 with a real Consul agent and reads back
// what Tier 2 will see: the service, its metadata, a passing HTTP check;
// then deregisters it.
func TestRegister(t *testing.T) {
	consul := testservice.StartConsul(t)
	client, err := api.NewClient(&api.Config{Address: consul.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer ready.Close()
	u, _ := url.Parse(ready.URL)
	port, _ := strconv.Atoi(u.Port())

	dereg, err := register.Register(context.Background(), client, register.Registration{
		Address: u.Hostname(), Port: port, Region: "eu-west", Cluster: "euw-h100", Models: []string{"llama", "llama-lora-a"},
		Cost: 2.75, CostUnit: register.CostPerGPUHour, Pricing: "spot", Capacity: 128,
		CheckHTTP: ready.URL + "/ready", CheckInterval: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	svc, _, err := client.Agent().Service("infergate-tier1-euw-h100", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"region": "eu-west", "cluster": "euw-h100", "models": "llama,llama-lora-a", "cost": "2.75",
		"cost_unit": "gpu-hour", "pricing": "spot", "capacity": "128", "scheme": "http"}
	for k, v := range want {
		if svc.Meta[k] != v {
			t.Errorf("meta[%s] = %q, want %q", k, svc.Meta[k], v)
		}
	}
	if svc.Service != register.ServiceName || svc.Port != port {
		t.Errorf("service = %s:%d", svc.Service, svc.Port)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		entries, _, err := client.Health().Service(register.ServiceName, "", true, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the health check never passed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := dereg(context.Background()); err != nil {
		t.Fatal(err)
	}
	if entries, _, _ := client.Health().Service(register.ServiceName, "", false, nil); len(entries) != 0 {
		t.Fatalf("still registered after deregister: %d", len(entries))
	}
	consul.Stop()
	if _, err := register.Register(context.Background(), client, register.Registration{
		Address: "127.0.0.1", Port: 1, Region: "r", Cluster: "c", Models: []string{"m"}, CheckHTTP: "http://127.0.0.1:1/",
	}); err == nil {
		t.Fatal("registering with Consul down should fail")
	}
}

// TestKeep re-registers after the agent forgets the service (a dev agent
// restarted loses everything) and deregisters when its context ends.
func TestKeep(t *testing.T) {
	consul := testservice.StartConsul(t)
	client, err := api.NewClient(&api.Config{Address: consul.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	reg := register.Registration{Address: "127.0.0.1", Port: 9, Region: "r", Cluster: "keep", Models: []string{"m"},
		CheckHTTP: "http://127.0.0.1:9/ready", CheckInterval: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- register.Keep(ctx, client, reg, 100*time.Millisecond, nil) }()
	present := func() bool {
		svc, _, err := client.Agent().Service("infergate-tier1-keep", nil)
		return err == nil && svc != nil
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: timed out", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait("registered", present)
	consul.Stop()
	consul.Start()
	wait("re-registered after the agent restarted", present)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if present() {
		t.Fatal("still registered after Keep returned")
	}
}

// TestRegisterACL runs Consul with ACLs on (default deny): registering
// without a token or with an unknown one fails with Consul's 403, and a
// token whose policy grants service:write on infergate-tier1 registers and
// deregisters.
func TestRegisterACL(t *testing.T) {
	const mgmt = "6d1c5b0e-93a5-4f43-9a55-2f1e1c1f0a01"
	consul := testservice.StartConsulOpts(t, testservice.ConsulOpts{ACLToken: mgmt})
	admin, err := api.NewClient(&api.Config{Address: consul.Addr(), Token: mgmt})
	if err != nil {
		t.Fatal(err)
	}
	writeTok := aclToken(t, admin, "tier1-register", `service "infergate-tier1" { policy = "write" }`)
	otherTok := aclToken(t, admin, "other-service", `service "something-else" { policy = "write" }`)

	reg := register.Registration{Address: "127.0.0.1", Port: 9, Region: "r", Cluster: "acl", Models: []string{"m"},
		CheckHTTP: "http://127.0.0.1:9/ready", CheckInterval: time.Second}
	for _, tc := range []struct {
		name, token string
		wantErr     string // "" = success
	}{
		{"no token", "", "Permission denied"},
		{"unknown token", "00000000-0000-4000-8000-000000000000", "ACL not found"},
		{"token for another service", otherTok, "Permission denied"},
		{"service:write", writeTok, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, err := api.NewClient(&api.Config{Address: consul.Addr(), Token: tc.token})
			if err != nil {
				t.Fatal(err)
			}
			dereg, err := register.Register(context.Background(), client, reg)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatal("registered without the right token")
				}
				if msg := err.Error(); !strings.Contains(msg, "403") || !strings.Contains(msg, tc.wantErr) || !strings.Contains(msg, "infergate-tier1-acl") {
					t.Fatalf("err = %q, want a 403 naming the service and %q", msg, tc.wantErr)
				}
				if svc, _, err := admin.Agent().Service("infergate-tier1-acl", nil); err == nil && svc != nil {
					t.Fatal("the service got registered anyway")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			svc, _, err := admin.Agent().Service("infergate-tier1-acl", nil)
			if err != nil || svc.Meta["cluster"] != "acl" {
				t.Fatalf("registered service = %+v, %v", svc, err)
			}
			if err := dereg(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, _, err := admin.Agent().Service("infergate-tier1-acl", nil); err == nil {
				t.Fatal("still registered after deregister")
			}
		})
	}

	// Keep reports the refusal instead of failing silently.
	client, err := api.NewClient(&api.Config{Address: consul.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- register.Keep(ctx, client, reg, 50*time.Millisecond, func(err error) {
			select {
			case errs <- err:
			default:
			}
		})
	}()
	select {
	case err = <-errs:
	case <-time.After(30 * time.Second):
		t.Fatal("Keep never reported the refusal")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Keep: %v", err)
	}
	if !strings.Contains(err.Error(), "403") {
		t.Fatalf("Keep reported %q, want Consul's 403", err)
	}
}

// aclToken creates a policy with rules and a token holding it, through the
// management client, and returns the token's secret.
func aclToken(t *testing.T, admin *api.Client, name, rules string) string {
	t.Helper()
	p, _, err := admin.ACL().PolicyCreate(&api.ACLPolicy{Name: name, Rules: rules}, nil)
	if err != nil {
		t.Fatalf("create policy %s: %v", name, err)
	}
	tok, _, err := admin.ACL().TokenCreate(&api.ACLToken{Description: name, Policies: []*api.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		t.Fatalf("create token %s: %v", name, err)
	}
	return tok.SecretID
}
