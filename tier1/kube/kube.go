// Package kube discovers Tier 1's model-server pods from the Kubernetes API
// with client-go informers (watches, not polling): through a Gateway API
// Inference Extension InferencePool, or by label selector and port. It hands
// the gateway the set of routable pods whenever it changes; the gateway
// keeps routing on the last set while the API server is unreachable.
//
// A pod is routable when it has an IP, its Ready condition is True, it is
// not terminating (no deletion timestamp) and it has not finished (phase
// Succeeded or Failed). Its engine, GPU and pool come from the labels (or
// annotations) infergate.io/engine, infergate.io/gpu and infergate.io/pool;
// the GPU falls back to the node's nvidia.com/gpu.product label when node
// lookup is on, and the engine to what the pod's metrics reveal. Its GPU
// count is its containers' nvidia.com/gpu limits.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	loader "github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/config"
	"github.com/infergate/infergate/tier1/kvevents"
)

// Labels (or annotations) a model-server pod may carry.
const (
	// LabelEngine is the pod's engine: vllm, vllm-legacy, sglang or tgi.
	// Absent, the engine is detected from the metrics the pod exports.
	LabelEngine = "infergate.io/engine"
	// LabelGPU is the pod's GPU type (h100, a10g, ...), for GPU-aware
	// scoring and reporting.
	LabelGPU = "infergate.io/gpu"
	// LabelPool is the infergate pool the pod joins, overriding the
	// source's pool.
	LabelPool = "infergate.io/pool"
	// NodeLabelGPU is the GPU product label NVIDIA's GPU feature discovery
	// puts on nodes.
	NodeLabelGPU = "nvidia.com/gpu.product"
)

// InferencePoolGVR is the Gateway API Inference Extension's InferencePool.
var InferencePoolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// Sink receives what discovery finds; *gateway.Gateway is one.
type Sink interface {
	SetDiscoveredPods(pods []config.PodConfig) error
	// SetDiscoveryProblem says why discovery is not working, "" when it is.
	SetDiscoveryProblem(problem string)
}

// Options are a Discoverer's collaborators. Zero fields take defaults.
type Options struct {
	// RestConfig connects to the API server; default from the config's
	// kubeconfig, else the in-cluster service account.
	RestConfig *rest.Config
	Logger     *slog.Logger // default slog.Default()
	// Recheck is how often the API server is checked after a watch error
	// and, while it is missing, the InferencePool CRD; default 10s.
	Recheck time.Duration
	// OnApply, when set, is called after each pod set is handed to the
	// sink (tests use it to know what the router sees).
	OnApply func(pods []config.PodConfig)
}

// Discoverer watches pods (and InferencePools) in one namespace.
type Discoverer struct {
	cfg       config.KubernetesConfig
	namespace string
	pools     map[string]bool
	defPool   string
	sink      Sink
	opts      Options
	log       *slog.Logger
	cs        kubernetes.Interface
	dyn       dynamic.Interface

	kick chan struct{}

	podInf  cache.SharedIndexInformer
	poolInf cache.SharedIndexInformer // nil until the CRD is found

	mu       sync.Mutex
	problems map[string]string // by kind: crd, watch, sync
	nodeGPU  map[string]string // node name -> GPU product
	noNodes  bool              // node lookup failed for good (RBAC)
	warned   map[string]bool   // pod/pool pairs already warned about
}

// New builds a Discoverer for cfg over the configured pool names (pods
// join the source's pool, the one pool when there is only one, or the pool
// their infergate.io/pool label names). Run starts it.
func New(cfg config.KubernetesConfig, pools []string, sink Sink, opts Options) (*Discoverer, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	loader.Default(&opts.Recheck, 10*time.Second)
	for i, src := range cfg.Sources {
		if src.Selector != "" {
			if _, err := labels.Parse(src.Selector); err != nil {
				return nil, fmt.Errorf("kubernetes.sources[%d]: selector: %w", i, err)
			}
		}
	}
	rc := opts.RestConfig
	if rc == nil {
		var err error
		if cfg.Kubeconfig != "" {
			rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		} else {
			rc, err = rest.InClusterConfig()
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes client config: %w", err)
		}
	}
	rc = rest.CopyConfig(rc)
	rc.UserAgent = "infergate-tier1"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	d := &Discoverer{
		cfg:       cfg,
		namespace: namespace(cfg.Namespace),
		pools:     map[string]bool{},
		sink:      sink,
		opts:      opts,
		log:       opts.Logger.With("component", "kube-discovery"),
		cs:        cs,
		dyn:       dyn,
		kick:      make(chan struct{}, 1),
		problems:  map[string]string{},
		nodeGPU:   map[string]string{},
		warned:    map[string]bool{},
	}
	for _, p := range pools {
		d.pools[p] = true
	}
	if len(pools) == 1 {
		d.defPool = pools[0]
	}
	return d, nil
}

// namespace is the configured one, else the pod's own, else "default".
func namespace(configured string) string {
	if configured != "" {
		return configured
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "default"
}

// Namespace is the namespace being watched.
func (d *Discoverer) Namespace() string { return d.namespace }

func (d *Discoverer) usesInferencePool() bool {
	return slices.ContainsFunc(d.cfg.Sources, func(s config.DiscoverySource) bool { return s.InferencePool != "" })
}

// Run watches until ctx is done. The pod set is first handed over once the
// initial pod list has arrived; until then the sink keeps its static pods.
func (d *Discoverer) Run(ctx context.Context) error {
	fac := informers.NewSharedInformerFactoryWithOptions(d.cs, 0, informers.WithNamespace(d.namespace))
	d.podInf = fac.Core().V1().Pods().Informer()
	if err := d.watch(d.podInf); err != nil {
		return err
	}
	d.setProblem("sync", fmt.Sprintf("waiting for the first pod list of namespace %s from the Kubernetes API", d.namespace))
	fac.Start(ctx.Done())
	defer fac.Shutdown()
	go func() {
		// An empty namespace sends no event after the first list: kick
		// once it has arrived so the (empty) set is handed over.
		if cache.WaitForCacheSync(ctx.Done(), d.podInf.HasSynced) {
			d.trigger()
		}
	}()

	var dynFac dynamicinformer.DynamicSharedInformerFactory
	defer func() {
		if dynFac != nil {
			dynFac.Shutdown()
		}
	}()
	startPools := func() {
		if dynFac != nil || !d.usesInferencePool() {
			return
		}
		ok, err := d.crdServed()
		switch {
		case err != nil:
			d.setProblem("crd", fmt.Sprintf("cannot tell whether the InferencePool CRD is installed: %v", err))
			return
		case !ok:
			msg := fmt.Sprintf("the InferencePool CRD (%s) is not installed: InferencePool sources find no pods; install it, or use selector+port", InferencePoolGVR.GroupVersion())
			if d.problem("crd") != msg {
				d.log.Warn("InferencePool CRD missing; serving the other sources' and static pods", "group_version", InferencePoolGVR.GroupVersion().String(), "recheck", d.opts.Recheck)
			}
			d.setProblem("crd", msg)
			return
		}
		dynFac = dynamicinformer.NewFilteredDynamicSharedInformerFactory(d.dyn, 0, d.namespace, nil)
		inf := dynFac.ForResource(InferencePoolGVR).Informer()
		if err := d.watch(inf); err != nil {
			d.log.Error("InferencePool informer", "err", err)
			dynFac = nil
			return
		}
		dynFac.Start(ctx.Done())
		d.mu.Lock()
		d.poolInf = inf
		d.mu.Unlock()
		d.setProblem("crd", "")
		d.log.Info("watching InferencePools", "namespace", d.namespace)
	}
	startPools()

	tick := time.NewTicker(d.opts.Recheck)
	defer tick.Stop()
	var last []config.PodConfig
	synced := false
	d.trigger()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if d.canListPods(ctx) {
				d.setProblem("watch", "")
			}
			startPools()
			continue
		case <-d.kick:
		}
		if !synced {
			if !d.podInf.HasSynced() {
				continue // the informer kicks again once it has listed
			}
			synced = true
			d.setProblem("sync", "")
			d.log.Info("pod list received; discovery is live", "namespace", d.namespace)
		}
		pods := d.routable(ctx)
		if last != nil && slices.EqualFunc(pods, last, podEqual) {
			continue
		}
		if err := d.sink.SetDiscoveredPods(pods); err != nil {
			d.log.Error("applying discovered pods", "err", err)
			continue
		}
		if len(pods) != len(last) {
			d.log.Info("discovered pods changed", "routable", len(pods))
		}
		last = pods
		if d.opts.OnApply != nil {
			d.opts.OnApply(slices.Clone(pods))
		}
	}
}

// watch makes every change of inf trigger a reconcile, and watch errors a
// problem (the informer retries on its own; the sink keeps the last view).
func (d *Discoverer) watch(inf cache.SharedIndexInformer) error {
	if err := inf.SetTransform(stripManagedFields); err != nil {
		return fmt.Errorf("informer transform: %w", err)
	}
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		d.setProblem("watch", fmt.Sprintf("watching the Kubernetes API failed (routing on the last view): %v", err))
	}); err != nil {
		return fmt.Errorf("informer error handler: %w", err)
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.changed() },
		UpdateFunc: func(any, any) { d.changed() },
		DeleteFunc: func(any) { d.changed() },
	})
	if err != nil {
		return fmt.Errorf("informer handler: %w", err)
	}
	return nil
}

// stripManagedFields drops what discovery never reads before it is cached.
func stripManagedFields(obj any) (any, error) {
	if a, err := apimeta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// changed is an informer event: the API answers again, and the set may
// have changed.
func (d *Discoverer) changed() {
	d.setProblem("watch", "")
	d.trigger()
}

func (d *Discoverer) trigger() {
	select {
	case d.kick <- struct{}{}:
	default: // a reconcile is already pending; it will see this change
	}
}

// canListPods asks the API server for one pod of the namespace (from its
// watch cache): it answers, and the router may read pods.
func (d *Discoverer) canListPods(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := d.cs.CoreV1().Pods(d.namespace).List(ctx, metav1.ListOptions{Limit: 1, ResourceVersion: "0"})
	return err == nil
}

// crdServed reports whether the API server serves InferencePools.
func (d *Discoverer) crdServed() (bool, error) {
	res, err := d.cs.Discovery().ServerResourcesForGroupVersion(InferencePoolGVR.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(res.APIResources, func(r metav1.APIResource) bool { return r.Name == InferencePoolGVR.Resource }), nil
}

func (d *Discoverer) problem(kind string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.problems[kind]
}

func (d *Discoverer) setProblem(kind, msg string) {
	d.mu.Lock()
	if d.problems[kind] == msg {
		d.mu.Unlock()
		return
	}
	if msg == "" {
		delete(d.problems, kind)
	} else {
		d.problems[kind] = msg
	}
	var all []string
	for _, k := range []string{"sync", "crd", "watch", "pool"} {
		if m := d.problems[k]; m != "" {
			all = append(all, m)
		}
	}
	d.mu.Unlock()
	if kind == "watch" && msg != "" {
		d.log.Warn("kubernetes watch failed; routing on the last view", "err", msg)
	}
	d.sink.SetDiscoveryProblem(strings.Join(all, "; "))
}

// selection is what one source selects right now.
type selection struct {
	sel  labels.Selector
	port int
	pool string
}

// selections resolves the sources; InferencePools that are missing or
// malformed select nothing and are reported.
func (d *Discoverer) selections() []selection {
	var out []selection
	var missing []string
	d.mu.Lock()
	poolInf := d.poolInf
	d.mu.Unlock()
	for _, src := range d.cfg.Sources {
		s := selection{port: src.Port, pool: src.Pool}
		if s.pool == "" {
			s.pool = d.defPool
		}
		if src.Selector != "" {
			s.sel, _ = labels.Parse(src.Selector) // checked in New
			out = append(out, s)
			continue
		}
		if poolInf == nil {
			continue // CRD missing: reported by Run
		}
		obj, ok, err := poolInf.GetStore().GetByKey(d.namespace + "/" + src.InferencePool)
		if err != nil || !ok {
			missing = append(missing, fmt.Sprintf("InferencePool %s/%s not found", d.namespace, src.InferencePool))
			continue
		}
		sel, port, err := parseInferencePool(obj.(*unstructured.Unstructured))
		if err != nil {
			missing = append(missing, fmt.Sprintf("InferencePool %s/%s: %v", d.namespace, src.InferencePool, err))
			continue
		}
		s.sel = sel
		if s.port == 0 {
			s.port = port
		}
		out = append(out, s)
	}
	d.setProblem("pool", strings.Join(missing, "; "))
	return out
}

// parseInferencePool reads spec.selector.matchLabels and the first
// spec.targetPorts number of an inference.networking.k8s.io/v1
// InferencePool.
func parseInferencePool(u *unstructured.Unstructured) (labels.Selector, int, error) {
	match, found, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil {
		return nil, 0, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	if !found || len(match) == 0 {
		// An empty selector would select every pod of the namespace.
		return nil, 0, errors.New("spec.selector.matchLabels is empty")
	}
	ports, _, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil {
		return nil, 0, fmt.Errorf("spec.targetPorts: %w", err)
	}
	port := 0
	if len(ports) > 0 {
		if m, ok := ports[0].(map[string]any); ok {
			if n, ok, _ := unstructured.NestedInt64(m, "number"); ok {
				port = int(n)
			}
		}
	}
	if port <= 0 || port > 65535 {
		return nil, 0, errors.New("spec.targetPorts[0].number is missing or out of range")
	}
	return labels.SelectorFromSet(match), port, nil
}

// routable lists the pods every source selects that can take requests,
// sorted by name; a pod selected by several sources counts once (the first
// source wins).
func (d *Discoverer) routable(ctx context.Context) []config.PodConfig {
	sels := d.selections()
	seen := map[string]bool{}
	out := []config.PodConfig{}
	objs := d.podInf.GetStore().List()
	for _, s := range sels {
		for _, o := range objs {
			pod, ok := o.(*corev1.Pod)
			if !ok || seen[pod.Name] || !s.sel.Matches(labels.Set(pod.Labels)) || !Routable(pod) {
				continue
			}
			pc, ok := d.podConfig(ctx, pod, s)
			if !ok {
				continue
			}
			seen[pod.Name] = true
			out = append(out, pc)
		}
	}
	slices.SortFunc(out, func(a, b config.PodConfig) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Routable reports whether pod can take new requests: it has an IP, is
// Ready, is not terminating and has not finished.
func Routable(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.PodIP == "" {
		return false
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// meta reads a label, else an annotation.
func meta(pod *corev1.Pod, key string) string {
	if v := pod.Labels[key]; v != "" {
		return v
	}
	return pod.Annotations[key]
}

func (d *Discoverer) podConfig(ctx context.Context, pod *corev1.Pod, s selection) (config.PodConfig, bool) {
	pool := s.pool
	if p := meta(pod, LabelPool); p != "" {
		pool = p
	}
	if !d.pools[pool] {
		key := pod.Name + "\x00" + pool
		d.mu.Lock()
		warn := !d.warned[key]
		d.warned[key] = true
		d.mu.Unlock()
		if warn {
			d.log.Warn("pod skipped: its pool is not configured", "pod", pod.Name, "pool", pool, "label", LabelPool)
		}
		return config.PodConfig{}, false
	}
	pc := config.PodConfig{
		Name:    pod.Name,
		Address: net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(s.port)),
		Pool:    pool,
		Engine:  meta(pod, LabelEngine),
		GPU:     meta(pod, LabelGPU),
		GPUs:    gpusOf(pod),
		Labels:  pod.Labels,
	}
	if pc.GPU == "" && d.cfg.NodeGPU && pod.Spec.NodeName != "" {
		pc.GPU = d.nodeGPUOf(ctx, pod.Spec.NodeName)
	}
	pc.KVEventsPort = d.portAnnotation(pod, kvevents.AnnotationPort, 1)
	pc.KVEventsReplayPort = d.portAnnotation(pod, kvevents.AnnotationReplayPort, 0)
	return pc, true
}

// portAnnotation reads a KV-events port annotation: 0 when absent (the
// kv_events default), -1 for a replay port of 0 (no replay). A value that
// is not a port from lowest up is ignored, with one warning per pod and value.
func (d *Discoverer) portAnnotation(pod *corev1.Pod, key string, lowest int) int {
	v, ok := pod.Annotations[key]
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < lowest || n > 65535 {
		warnKey := pod.Name + "\x00" + key + "\x00" + v
		d.mu.Lock()
		warn := !d.warned[warnKey]
		d.warned[warnKey] = true
		d.mu.Unlock()
		if warn {
			d.log.Warn("pod annotation ignored: not a port", "pod", pod.Name, "annotation", key, "value", v)
		}
		return 0
	}
	if n == 0 {
		return -1
	}
	return n
}

// nodeGPUOf reads node's GPU product label once and caches it. A lookup
// the router is not allowed to make turns node lookup off, with one log
// line; other failures are retried on the next change.
func (d *Discoverer) nodeGPUOf(ctx context.Context, node string) string {
	d.mu.Lock()
	gpu, ok := d.nodeGPU[node]
	off := d.noNodes
	d.mu.Unlock()
	if ok || off {
		return gpu
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n, err := d.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err):
		d.log.Warn("node lookup forbidden; set infergate.io/gpu on pods or grant `get nodes` (chart: rbac.nodes=true)", "node", node)
		d.mu.Lock()
		d.noNodes = true
		d.mu.Unlock()
		return ""
	case err != nil:
		d.log.Warn("node lookup failed", "node", node, "err", err)
		return ""
	}
	gpu = n.Labels[NodeLabelGPU]
	d.mu.Lock()
	d.nodeGPU[node] = gpu
	d.mu.Unlock()
	return gpu
}

func podEqual(a, b config.PodConfig) bool {
	return a.Name == b.Name && a.Address == b.Address && a.Pool == b.Pool &&
		a.Engine == b.Engine && a.GPU == b.GPU && a.GPUs == b.GPUs && mapsEqual(a.Labels, b.Labels) &&
		a.KVEventsPort == b.KVEventsPort && a.KVEventsReplayPort == b.KVEventsReplayPort
}

// ResourceGPU is the extended resource NVIDIA's device plugin schedules.
const ResourceGPU corev1.ResourceName = "nvidia.com/gpu"

// gpusOf is how many GPUs the pod's containers are given (their
// nvidia.com/gpu limits, else requests); 0 if none says.
func gpusOf(pod *corev1.Pod) int {
	n := int64(0)
	for _, c := range pod.Spec.Containers {
		q, ok := c.Resources.Limits[ResourceGPU]
		if !ok {
			q, ok = c.Resources.Requests[ResourceGPU]
		}
		if ok {
			n += q.Value()
		}
	}
	return int(n)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
