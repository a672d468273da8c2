package kube_test

import (
	"bufio"
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
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/sim/server"
	"github.com/infergate/infergate/tier1/config"
	"github.com/infergate/infergate/tier1/gateway"
	"github.com/infergate/infergate/tier1/kube"
)

const model = "llama-3.1-8b"

// The tests share one control plane (etcd + kube-apiserver take seconds to
// start); each subtest works in its own namespace. The API-server restart
// runs last.
func TestDiscoveryAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	start := time.Now()
	k := testservice.StartKube(t)
	t.Logf("control plane ready in %v", time.Since(start).Round(time.Millisecond))
	c := newCluster(t, k)

	t.Run("PodsJoinAndLeave", c.testPodsJoinAndLeave)
	t.Run("NodeGPU", c.testNodeGPU)
	t.Run("DeletedDuringStream", c.testDeletedDuringStream)
	t.Run("InferencePool", c.testInferencePool)
	t.Run("Churn", c.testChurn)
	t.Run("APIServerRestart", c.testAPIServerRestart)
}

type cluster struct {
	k      *testservice.Kube
	admin  kubernetes.Interface
	dyn    dynamic.Interface
	port   int // model-server port, the same on every 127.0.0.x address
	nextIP atomic.Uint32
}

func newCluster(t *testing.T, k *testservice.Kube) *cluster {
	rc := &rest.Config{Host: k.Host(), BearerToken: k.AdminToken, TLSClientConfig: rest.TLSClientConfig{CAData: k.CAData()}, QPS: 200, Burst: 400}
	c := &cluster{k: k, admin: kubernetes.NewForConfigOrDie(rc), dyn: dynamic.NewForConfigOrDie(rc), port: testservice.FreePort(t)}
	c.nextIP.Store(1)
	return c
}

// ip hands out 127.0.0.2, 127.0.0.3, ... (127.0.1.x after 127.0.0.254).
func (c *cluster) ip() string {
	n := c.nextIP.Add(1)
	return fmt.Sprintf("127.0.%d.%d", n/250, 2+n%250)
}

// namespace creates a namespace and lets the router's user (not an admin)
// read pods and InferencePools there, as the chart's Role does.
func (c *cluster) namespace(t *testing.T) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	name = strings.TrimPrefix(name, "testdiscoveryagainstapiserver-")
	ctx := context.Background()
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "tier1"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{kube.InferencePoolGVR.Group}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	if _, err := c.admin.RbacV1().Roles(name).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tier1"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "tier1"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: testservice.KubeUser}},
	}
	if _, err := c.admin.RbacV1().RoleBindings(name).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// simPod is a simulated model server listening on its own loopback address.
type simPod struct {
	name, ip string
	pod      *server.Pod
}

func (c *cluster) startSim(t testing.TB, name string) *simPod {
	return c.startSimScaled(t, name, 0.02)
}

// startSimScaled starts a simulator running at timeScale real seconds per
// simulated second.
func (c *cluster) startSimScaled(t testing.TB, name string, timeScale float64) *simPod {
	t.Helper()
	ip := c.ip()
	p, err := server.Listen(context.Background(), server.Config{
		Name: name, TimeScale: timeScale, Logger: slog.New(slog.DiscardHandler),
	}, net.JoinHostPort(ip, fmt.Sprint(c.port)))
	if err != nil {
		t.Fatalf("sim %s: %v", name, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &simPod{name: name, ip: ip, pod: p}
}

// createPod creates a pod bound to node-1 (no scheduler runs) and, when
// ready, writes the status a kubelet would: Running, its IP, Ready.
func (c *cluster) createPod(t testing.TB, ns, name, ip string, lbls map[string]string, ready bool) {
	t.Helper()
	c.createPodGPUs(t, ns, name, ip, lbls, ready, 0)
}

// createPodGPUs is createPod with a container limited to gpus NVIDIA GPUs
// (none when 0).
func (c *cluster) createPodGPUs(t testing.TB, ns, name, ip string, lbls map[string]string, ready bool, gpus int64) {
	t.Helper()
	ctx := context.Background()
	ctr := corev1.Container{Name: "vllm", Image: "vllm/vllm-openai"}
	if gpus > 0 {
		q := *resource.NewQuantity(gpus, resource.DecimalSI)
		ctr.Resources.Limits = corev1.ResourceList{kube.ResourceGPU: q}
		ctr.Resources.Requests = corev1.ResourceList{kube.ResourceGPU: q}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec: corev1.PodSpec{
			NodeName:   "node-1",
			Containers: []corev1.Container{ctr},
		},
	}
	if _, err := c.admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	if ready {
		c.setStatus(t, ns, name, ip, true)
	}
}

func (c *cluster) setStatus(t testing.TB, ns, name, ip string, ready bool) {
	t.Helper()
	ctx := context.Background()
	pod, err := c.admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
	if _, err := c.admin.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("status of pod %s: %v", name, err)
	}
}

// terminate deletes a pod gracefully: with a node and no kubelet to confirm,
// it stays, terminating (deletion timestamp set), until forceDelete.
func (c *cluster) terminate(t testing.TB, ns, name string) {
	t.Helper()
	grace := int64(30)
	if err := c.admin.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatalf("delete pod %s: %v", name, err)
	}
}

func (c *cluster) forceDelete(t testing.TB, ns, name string) {
	t.Helper()
	grace := int64(0)
	if err := c.admin.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatalf("force delete pod %s: %v", name, err)
	}
}

// router is a Tier 1 gateway fed by a Discoverer running as the
// unprivileged user.
type router struct {
	gw  *gateway.Gateway
	url string
	d   *kube.Discoverer

	mu      sync.Mutex
	applied []config.PodConfig
	changes map[string]time.Time // pod -> when it last left the applied set
	listed  map[string]bool      // pods that were ever in the applied set
	wake    chan struct{}
}

func (c *cluster) startRouter(t testing.TB, ns string, kc config.KubernetesConfig, scrapeEvery time.Duration) *router {
	t.Helper()
	if scrapeEvery == 0 {
		scrapeEvery = 20 * time.Millisecond
	}
	cfg := &config.Config{
		Auth:   config.AuthConfig{Disabled: true},
		Scrape: config.ScrapeConfig{Interval: scrapeEvery},
		Pools:  []config.PoolConfig{{Name: "llama", Model: model}},
	}
	kc.Namespace = ns
	cfg.Kubernetes = kc
	ctx, cancel := context.WithCancel(context.Background())
	gw, err := gateway.New(ctx, cfg, gateway.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r := &router{gw: gw, changes: map[string]time.Time{}, listed: map[string]bool{}, wake: make(chan struct{}, 1)}
	rc := &rest.Config{Host: c.k.Host(), BearerToken: c.k.UserToken, TLSClientConfig: rest.TLSClientConfig{CAData: c.k.CAData()}}
	r.d, err = kube.New(kc, []string{"llama"}, gw, kube.Options{
		RestConfig: rc, Recheck: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		OnApply: r.onApply,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.url = "http://" + ln.Addr().String()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = r.d.Run(ctx) }()
	go func() { defer wg.Done(); _ = gw.Serve(ctx, ln, time.Second) }()
	t.Cleanup(func() { cancel(); wg.Wait(); gw.Close() })
	return r
}

func (r *router) onApply(pods []config.PodConfig) {
	now := time.Now()
	r.mu.Lock()
	for _, old := range r.applied {
		if !slices.ContainsFunc(pods, func(p config.PodConfig) bool { return p.Name == old.Name }) {
			r.changes[old.Name] = now
		}
	}
	for _, p := range pods {
		r.listed[p.Name] = true
	}
	r.applied = pods
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// waitLeft waits, after pod's termination, until it has left the router's
// set. A pod the router never listed has nothing to leave: created and
// terminated between two reconciles (a loaded machine delays watch events
// by seconds), it was never routable, and after 10 s without it appearing
// the wait ends. A listed pod still in the set after 60 s is an error.
func (r *router) waitLeft(t testing.TB, pod string) {
	start := time.Now()
	for r.leftAt(pod).IsZero() {
		r.mu.Lock()
		listed := r.listed[pod]
		r.mu.Unlock()
		switch waited := time.Since(start); {
		case !listed && waited > 10*time.Second:
			return
		case waited > time.Minute:
			t.Errorf("pod %s still routable %v after its termination", pod, waited.Round(time.Second))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leftAt is when pod last left the router's set (zero if it has not).
func (r *router) leftAt(pod string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changes[pod]
}

func (r *router) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, p := range r.applied {
		out = append(out, p.Name)
	}
	return out
}

func (r *router) pod(name string) (config.PodConfig, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.applied {
		if p.Name == name {
			return p, true
		}
	}
	return config.PodConfig{}, false
}

// waitSet waits until the router's discovered set is exactly want.
func (r *router) waitSet(t testing.TB, want ...string) {
	t.Helper()
	slices.Sort(want)
	deadline := time.After(30 * time.Second)
	for {
		got := r.names()
		if slices.Equal(got, want) || (len(got) == 0 && len(want) == 0) {
			return
		}
		select {
		case <-r.wake:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("discovered pods %v, want %v", got, want)
		}
	}
}

type debugPod struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	GPU     string `json:"gpu"`
	GPUs    int    `json:"gpus"`
	Engine  string `json:"engine"`
	Ready   bool   `json:"ready"`
}

func (r *router) debugPods(t testing.TB) []debugPod {
	t.Helper()
	resp, err := http.Get(r.url + "/debug/pods")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Pods []debugPod `json:"pods"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Pods
}

// waitRoutable waits until the router has scraped every named pod ready.
func (r *router) waitRoutable(t testing.TB, names ...string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ready := map[string]bool{}
		for _, p := range r.debugPods(t) {
			ready[p.Name] = p.Ready
		}
		ok := true
		for _, n := range names {
			ok = ok && ready[n]
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods %v not routable: %v", names, ready)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type reply struct {
	status int
	pod    string
	body   string
}

func (r *router) chat(t testing.TB, stream bool, maxTokens int) reply {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":%d,"stream":%v}`, model, maxTokens, stream)
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Errorf("request: %v", err)
		return reply{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header.Get("X-Infergate-Pod"), string(b)}
}

func (c *cluster) testPodsJoinAndLeave(t *testing.T) {
	ns := c.namespace(t)
	app := map[string]string{"app": "vllm"}
	a, b := c.startSim(t, "a"), c.startSim(t, "b")
	c.createPod(t, ns, "a", a.ip, app, true)
	c.createPod(t, ns, "other", c.ip(), map[string]string{"app": "web"}, true) // not selected
	r := c.startRouter(t, ns, config.KubernetesConfig{Sources: []config.DiscoverySource{{Selector: "app=vllm", Port: c.port}}}, 0)
	r.waitSet(t, "a")
	r.waitRoutable(t, "a")
	if got := r.chat(t, false, 4); got.status != 200 || got.pod != "a" {
		t.Fatalf("chat: %d from %q: %s", got.status, got.pod, got.body)
	}
	p, _ := r.pod("a")
	if p.Address != net.JoinHostPort(a.ip, fmt.Sprint(c.port)) || p.Pool != "llama" {
		t.Errorf("pod a discovered as %+v", p)
	}

	// Created without status: no IP, not ready, not routable.
	c.createPodGPUs(t, ns, "b", b.ip, map[string]string{"app": "vllm", kube.LabelEngine: "vllm", kube.LabelGPU: "a10g"}, false, 4)
	time.Sleep(300 * time.Millisecond)
	r.waitSet(t, "a")
	c.setStatus(t, ns, "b", b.ip, true)
	r.waitSet(t, "a", "b")
	r.waitRoutable(t, "a", "b")
	if p, _ := r.pod("b"); p.Engine != "vllm" || p.GPU != "a10g" || p.GPUs != 4 {
		t.Errorf("pod b labels or GPU limit not read: %+v", p)
	}
	if p, _ := r.pod("a"); p.GPUs != 0 {
		t.Errorf("pod a without a GPU limit has %d GPUs", p.GPUs)
	}

	// Not ready: out at once.
	c.setStatus(t, ns, "a", a.ip, false)
	r.waitSet(t, "b")
	for range 5 {
		if got := r.chat(t, false, 4); got.status != 200 || got.pod != "b" {
			t.Fatalf("after a turned unready: %d from %q: %s", got.status, got.pod, got.body)
		}
	}
	// Terminating: out at once too; deleted: still out.
	c.terminate(t, ns, "b")
	r.waitSet(t)
	if got := r.chat(t, false, 4); got.status != 503 {
		t.Fatalf("no pods left: status %d (%s), want 503", got.status, got.body)
	}
	c.forceDelete(t, ns, "b")
	c.setStatus(t, ns, "a", a.ip, true)
	r.waitSet(t, "a")
}

func (c *cluster) testNodeGPU(t *testing.T) {
	ns := c.namespace(t)
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{kube.NodeLabelGPU: "NVIDIA-H100-80GB-HBM3"}}}
	if _, err := c.admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := c.startSim(t, "a")
	c.createPod(t, ns, "a", a.ip, map[string]string{"app": "vllm"}, true)
	kc := config.KubernetesConfig{NodeGPU: true, Sources: []config.DiscoverySource{{Selector: "app=vllm", Port: c.port}}}

	// The namespaced Role does not allow `get nodes`: the pod still
	// serves, without a GPU.
	r := c.startRouter(t, ns, kc, 0)
	r.waitSet(t, "a")
	if p, _ := r.pod("a"); p.GPU != "" {
		t.Errorf("GPU %q without node access", p.GPU)
	}

	cr := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "tier1-nodes"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}},
	}
	if _, err := c.admin.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tier1-nodes"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "tier1-nodes"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: testservice.KubeUser}},
	}
	if _, err := c.admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r2 := c.startRouter(t, ns, kc, 0)
	r2.waitSet(t, "a")
	if p, _ := r2.pod("a"); p.GPU != "NVIDIA-H100-80GB-HBM3" {
		t.Errorf("GPU %q, want the node's label", p.GPU)
	}
}

// A pod deleted while it streams leaves the candidate set at once, and the
// stream it is serving completes.
func (c *cluster) testDeletedDuringStream(t *testing.T) {
	ns := c.namespace(t)
	app := map[string]string{"app": "vllm"}
	a := c.startSimScaled(t, "a", 1) // real GPU speed: the stream lasts seconds
	c.createPod(t, ns, "a", a.ip, app, true)
	r := c.startRouter(t, ns, config.KubernetesConfig{Sources: []config.DiscoverySource{{Selector: "app=vllm", Port: c.port}}}, 0)
	r.waitRoutable(t, "a")

	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"tell me"}],"max_tokens":400,"stream":true}`, model)
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	events := 0
	for events < 3 && sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	c.terminate(t, ns, "a")
	r.waitSet(t)
	if got := r.chat(t, false, 4); got.status != 503 {
		t.Errorf("request after delete: %d from %q, want 503", got.status, got.pod)
	}
	done := false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
		done = done || sc.Text() == "data: [DONE]"
	}
	if err := sc.Err(); err != nil || !done {
		t.Fatalf("stream cut after %d events (done=%v): %v", events, done, err)
	}
	if events < 50 {
		t.Errorf("stream ended after %d events; the deletion happened mid-stream?", events)
	}
	c.forceDelete(t, ns, "a")
}

// InferencePool: the CRD missing is reported and does not stop the
// router; once installed, the pool's selector and port are used, and a
// selector change moves the pods.
func (c *cluster) testInferencePool(t *testing.T) {
	ns := c.namespace(t)
	a, b := c.startSim(t, "a"), c.startSim(t, "b")
	c.createPod(t, ns, "a", a.ip, map[string]string{"app": "vllm", "track": "stable"}, true)
	c.createPod(t, ns, "b", b.ip, map[string]string{"app": "vllm", "track": "canary"}, true)
	kc := config.KubernetesConfig{Sources: []config.DiscoverySource{{InferencePool: "llama"}}}
	r := c.startRouter(t, ns, kc, 0)

	ready := func() (int, string) {
		resp, err := http.Get(r.url + "/ready")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := ready()
		if code == 503 && strings.Contains(body, "InferencePool CRD") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/ready %d %s: want 503 naming the missing CRD", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	c.applyCRD(t)
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1",
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": "llama"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "vllm", "track": "stable"}},
			"targetPorts":       []any{map[string]any{"number": int64(c.port)}},
			"endpointPickerRef": map[string]any{"name": "infergate-tier1-epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	pools := c.dyn.Resource(kube.InferencePoolGVR).Namespace(ns)
	if _, err := pools.Create(context.Background(), pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitSet(t, "a")
	r.waitRoutable(t, "a")
	if code, body := ready(); code != 200 {
		t.Errorf("/ready %d %s after the CRD and pool exist", code, body)
	}
	if got := r.chat(t, false, 4); got.pod != "a" {
		t.Fatalf("chat: %d from %q", got.status, got.pod)
	}

	// Selector change: the canary takes over.
	cur, err := pools.Get(context.Background(), "llama", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedStringMap(cur.Object, map[string]string{"app": "vllm", "track": "canary"}, "spec", "selector", "matchLabels"); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitSet(t, "b")
	r.waitRoutable(t, "b")
	for range 5 {
		if got := r.chat(t, false, 4); got.status != 200 || got.pod != "b" {
			t.Fatalf("after selector change: %d from %q", got.status, got.pod)
		}
	}

	// The pool deleted: no pods, and /ready says why.
	if err := pools.Delete(context.Background(), "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitSet(t)
	if code, body := ready(); code != 503 || !strings.Contains(body, "InferencePool "+ns+"/llama not found") {
		t.Errorf("/ready %d %s after the pool was deleted", code, body)
	}
}

// applyCRD installs the chart's InferencePool CRD and waits until it is
// served.
func (c *cluster) applyCRD(t *testing.T) {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "deploy", "helm", "infergate-tier1", "files", "inferencepool-crd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var crd unstructured.Unstructured
	if err := utilyaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&crd.Object); err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	ctx := context.Background()
	if _, err := c.dyn.Resource(gvr).Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("installing the chart's CRD: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.admin.Discovery().ServerResourcesForGroupVersion("inference.networking.k8s.io/v1")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD not served: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Churn: pods come and go quickly under load; no request is sent to a pod
// after the router dropped it, and no request fails.
func (c *cluster) testChurn(t *testing.T) {
	const (
		total    = 200                     // pods created and deleted
		rate     = 20                      // pods per second
		lifetime = 1500 * time.Millisecond // ready for this long
		grace    = time.Second             // serving after the router dropped it
	)
	ns := c.namespace(t)
	app := map[string]string{"app": "vllm"}
	for _, n := range []string{"stable-0", "stable-1"} {
		s := c.startSim(t, n)
		c.createPod(t, ns, n, s.ip, app, true)
	}
	r := c.startRouter(t, ns, config.KubernetesConfig{Sources: []config.DiscoverySource{{Selector: "app=vllm", Port: c.port}}}, 100*time.Millisecond)
	r.waitRoutable(t, "stable-0", "stable-1")

	type sent struct {
		at     time.Time
		status int
		pod    string
		body   string
	}
	var (
		mu   sync.Mutex
		log  []sent
		stop = make(chan struct{})
		wg   sync.WaitGroup
	)
	for range 4 {
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
				got := r.chat(t, false, 8)
				mu.Lock()
				log = append(log, sent{at, got.status, got.pod, got.body})
				mu.Unlock()
			}
		}()
	}

	start := time.Now()
	var churn sync.WaitGroup
	for i := range total {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / rate)))
		churn.Add(1)
		go func() {
			defer churn.Done()
			name := fmt.Sprintf("churn-%03d", i)
			s := c.startSim(t, name)
			c.createPod(t, ns, name, s.ip, app, true)
			time.Sleep(lifetime)
			c.terminate(t, ns, name)
			r.waitLeft(t, name)
			// What a kubelet does after the grace period (30 s by
			// default; shortened here): the server stops, the pod
			// object goes. A request ranked just before the pod left
			// may still be dialling it; under the race detector on a
			// loaded CI machine that took over 100 ms, so the grace is
			// a second, still far below any real one.
			time.Sleep(grace)
			_ = s.pod.Close()
			c.forceDelete(t, ns, name)
		}()
	}
	churn.Wait()
	elapsed := time.Since(start)
	close(stop)
	wg.Wait()
	r.waitSet(t, "stable-0", "stable-1")

	served := map[string]int{}
	for _, s := range log {
		if s.status != 200 {
			t.Errorf("request at %v failed: %d %s", s.at.Sub(start), s.status, s.body)
			continue
		}
		served[s.pod]++
		if left := r.leftAt(s.pod); !left.IsZero() && s.at.After(left) {
			t.Errorf("request sent %v after %s left the router's set was served by it", s.at.Sub(left), s.pod)
		}
	}
	churned := 0
	for name := range served {
		if strings.HasPrefix(name, "churn-") {
			churned++
		}
	}
	t.Logf("%d pods churned in %v; %d requests, %d churned pods served some", total, elapsed.Round(time.Millisecond), len(log), churned)
	// A churned pod is routable only after its first scrape, for about
	// lifetime; under the race detector on a loaded machine that window
	// shrinks, so the bar is that churned pods take traffic at all in
	// numbers, not a share tied to this machine's speed.
	if churned < total/10 {
		t.Errorf("only %d of %d churned pods took traffic", churned, total)
	}
}

// The API server going away leaves the router routing on its last view;
// when it is back, the watch resumes and changes arrive again.
func (c *cluster) testAPIServerRestart(t *testing.T) {
	ns := c.namespace(t)
	app := map[string]string{"app": "vllm"}
	a, b, cc := c.startSim(t, "a"), c.startSim(t, "b"), c.startSim(t, "c")
	c.createPod(t, ns, "a", a.ip, app, true)
	c.createPod(t, ns, "b", b.ip, app, true)
	r := c.startRouter(t, ns, config.KubernetesConfig{Sources: []config.DiscoverySource{{Selector: "app=vllm", Port: c.port}}}, 0)
	r.waitRoutable(t, "a", "b")

	c.k.Stop()
	down := time.Now()
	seen := map[string]bool{}
	for time.Since(down) < 2*time.Second {
		got := r.chat(t, false, 4)
		if got.status != 200 {
			t.Fatalf("while the API server is down: %d %s", got.status, got.body)
		}
		seen[got.pod] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("served by %v while the API server was down, want a and b", seen)
	}
	if got := r.names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("view while down: %v", got)
	}
	c.k.Start()
	t.Logf("API server down for %v", time.Since(down).Round(time.Millisecond))

	c.createPod(t, ns, "c", cc.ip, app, true)
	c.terminate(t, ns, "a")
	r.waitSet(t, "b", "c")
	r.waitRoutable(t, "c")
}
