package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/sim/server"
)

// TestKubeScaleUnderLoad runs the infergate binary as Tier 1 with
// Kubernetes discovery against a real kube-apiserver, and scales a
// simulated vLLM Deployment from 2 to 6 pods and back while clients send
// requests: no request fails, and each new pod takes traffic within a
// second of turning ready.
func TestKubeScaleUnderLoad(t *testing.T) {
	needBinary(t)
	k := testservice.StartKube(t)
	rc := &rest.Config{Host: k.Host(), BearerToken: k.AdminToken, TLSClientConfig: rest.TLSClientConfig{CAData: k.CAData()}}
	admin := kubernetes.NewForConfigOrDie(rc)
	const ns = "llm"
	ctx := context.Background()
	mustKube(t, func() error {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		return err
	})
	// The chart's Role: get/list/watch pods in the namespace, nothing else.
	mustKube(t, func() error {
		_, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "tier1"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
		}, metav1.CreateOptions{})
		return err
	})
	mustKube(t, func() error {
		_, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "tier1"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "tier1"},
			Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: testservice.KubeUser}},
		}, metav1.CreateOptions{})
		return err
	})

	port := testservice.FreePort(t)
	dep := &simDeployment{t: t, admin: admin, ns: ns, port: port, readyAt: map[string]time.Time{}}

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "tier1.yaml")
	const token = "kube-it-token"
	cfg := fmt.Sprintf(`auth: {tokens: [%s]}
pools: [{name: llama, model: llama-3.1-8b}]
kubernetes:
  kubeconfig: %q
  namespace: %s
  sources: [{selector: "app=vllm", port: %d}]
`, token, k.Kubeconfig(k.UserToken, ns), ns, port)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	dep.scale(2)
	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(testservice.FreePort(t)))
	tier1 := startProc(t, "tier1", "tier1", "--config", cfgPath, "--listen", addr)
	base := "http://" + addr
	waitOK(t, tier1, base+"/ready", 60*time.Second)
	dep.routed = func() ([]string, error) { return debugPodNames(base, token) }

	type sent struct {
		at     time.Time
		status int
		pod    string
		err    error
	}
	var (
		mu    sync.Mutex
		sends []sent
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	body := `{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`
	client := &http.Client{Timeout: 30 * time.Second}
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				at := time.Now()
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				s := sent{at: at}
				resp, err := client.Do(req)
				if err != nil {
					s.err = err
				} else {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					s.status, s.pod = resp.StatusCode, resp.Header.Get("X-Infergate-Pod")
				}
				mu.Lock()
				sends = append(sends, s)
				mu.Unlock()
			}
		}()
	}

	start := time.Now()
	time.Sleep(2 * time.Second)
	dep.scale(6)
	time.Sleep(3 * time.Second)
	dep.scale(2)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()

	failed := 0
	first := map[string]time.Time{}
	for _, s := range sends {
		if s.err != nil || s.status != http.StatusOK {
			failed++
			if failed <= 5 {
				t.Errorf("request at %v: status %d, err %v", s.at.Sub(start).Round(time.Millisecond), s.status, s.err)
			}
			continue
		}
		if f, ok := first[s.pod]; !ok || s.at.Before(f) {
			first[s.pod] = s.at
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d requests failed", failed, len(sends))
	}
	var lags []time.Duration
	for _, name := range dep.scaledUp {
		ready := dep.readyAt[name]
		f, ok := first[name]
		if !ok {
			t.Errorf("new pod %s never took traffic", name)
			continue
		}
		lag := f.Sub(ready)
		lags = append(lags, lag)
		if lag > time.Second {
			t.Errorf("new pod %s first took traffic %v after turning ready, want within 1s", name, lag)
		}
	}
	t.Logf("%d requests in %v, %d failed; new pods' ready-to-first-request: %v", len(sends), time.Since(start).Round(time.Millisecond), failed, lags)
}

func mustKube(t *testing.T, f func() error) {
	t.Helper()
	if err := f(); err != nil {
		t.Fatal(err)
	}
}

// simDeployment does what a Deployment, the scheduler and kubelets would
// for simulated vLLM pods: scaling up starts a simulator on a fresh
// loopback address, creates its pod and marks it ready; scaling down
// deletes the newest pod gracefully, waits until Tier 1 no longer routes to
// it plus a preStop-like pause, then stops the simulator and removes the
// pod.
type simDeployment struct {
	t       *testing.T
	admin   kubernetes.Interface
	ns      string
	port    int
	next    int
	pods    []*simPodRef
	routed  func() ([]string, error)
	readyAt map[string]time.Time
	// scaledUp are the pods created after the first scale call.
	scaledUp []string
}

type simPodRef struct {
	name string
	sim  *server.Pod
}

func (d *simDeployment) scale(n int) {
	t := d.t
	t.Helper()
	ctx := context.Background()
	initial := len(d.pods) == 0 && d.next == 0
	for len(d.pods) < n {
		d.next++
		name := fmt.Sprintf("vllm-%d", d.next)
		ip := fmt.Sprintf("127.0.%d.%d", 100+d.next/200, 2+d.next%200)
		sim, err := server.Listen(context.Background(), server.Config{Name: name, TimeScale: 0.02, Logger: slog.New(slog.DiscardHandler)}, net.JoinHostPort(ip, fmt.Sprint(d.port)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sim.Close() })
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "vllm", "infergate.io/engine": "vllm"}},
			Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
		}
		created, err := d.admin.CoreV1().Pods(d.ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
		}
		if _, err := d.admin.CoreV1().Pods(d.ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		d.readyAt[name] = time.Now()
		if !initial {
			d.scaledUp = append(d.scaledUp, name)
		}
		d.pods = append(d.pods, &simPodRef{name: name, sim: sim})
	}
	for len(d.pods) > n {
		p := d.pods[len(d.pods)-1]
		d.pods = d.pods[:len(d.pods)-1]
		grace := int64(30)
		if err := d.admin.CoreV1().Pods(d.ns).Delete(ctx, p.name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, p.name+" out of Tier 1's pods", 30*time.Second, func() error {
			names, err := d.routed()
			if err == nil && slices.Contains(names, p.name) {
				err = fmt.Errorf("still routed")
			}
			return err
		})
		time.Sleep(500 * time.Millisecond) // preStop: in-flight requests finish
		_ = p.sim.Close()
		zero := int64(0)
		if err := d.admin.CoreV1().Pods(d.ns).Delete(ctx, p.name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
}

// debugPodNames lists the pods Tier 1 routes to (its /debug/pods).
func debugPodNames(base, token string) ([]string, error) {
	req, _ := http.NewRequest(http.MethodGet, base+"/debug/pods", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Pods []struct {
			Name string `json:"name"`
		} `json:"pods"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	var names []string
	for _, p := range out.Pods {
		names = append(names, p.Name)
	}
	return names, nil
}
