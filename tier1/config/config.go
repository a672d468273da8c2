// Package config is the schema of Tier 1's configuration file: where the
// router listens, who may call it, which pods serve which models, how it
// scrapes, retries, queues and schedules, and how its replicas share state.
// It is decoded with shared/config (strict YAML, then SetDefaults and
// Validate). Applying it, including hot reload, is tier1/gateway's; pod
// discovery (tier1/kube) and the peer mesh (tier1/peers) read it without
// depending on the proxy.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	loader "github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/tlsfiles"
	"github.com/infergate/infergate/shared/tracing"
	"github.com/infergate/infergate/tier1/kvevents"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/scrape"
	"github.com/infergate/infergate/tier1/tokenize"
)

// Config is the whole Tier 1 configuration file.
type Config struct {
	Listen string `yaml:"listen"` // the OpenAI API's address (--listen overrides); default 127.0.0.1:8080
	// MetricsListen is where /metrics (and the status page) is served,
	// apart from the API listener (--metrics-listen overrides); default
	// 127.0.0.1:9090 (loopback), "-" turns it off. The default is best
	// effort: if its port is taken, a warning and no metrics listener, so
	// several routers start on one host; an address set here must be free.
	MetricsListen string `yaml:"metrics_listen"`
	Cluster       string `yaml:"cluster"` // the cluster's name, in the load summary and Consul; default "local"
	Region        string `yaml:"region"`  // the cluster's region, in the load summary and Consul; default "local"

	// TLS serves the OpenAI API (listen) over TLS; client_ca_file turns
	// on mutual TLS (Tier 2 presenting a client certificate). MetricsTLS
	// and ExtProcTLS do the same for the metrics and ext_proc listeners.
	// Off while cert_file and key_file are empty. Which files is read at
	// start; their content is reloaded when it changes (docs/security.md).
	TLS        tlsfiles.Server `yaml:"tls"`
	MetricsTLS tlsfiles.Server `yaml:"metrics_tls"`
	ExtProcTLS tlsfiles.Server `yaml:"ext_proc_tls"`

	Auth     AuthConfig     `yaml:"auth"`
	Upstream UpstreamConfig `yaml:"upstream"`
	// PodHeader names the response header carrying the pod that served
	// the request; default x-infergate-pod. "-" disables it.
	PodHeader    string        `yaml:"pod_header"`
	MaxBodyBytes int64         `yaml:"max_body_bytes"` // request body limit (413 above); default 16 MiB
	Timeouts     TimeoutConfig `yaml:"timeouts"`
	Retry        RetryConfig   `yaml:"retry"`
	Queue        QueueConfig   `yaml:"queue"`
	Scrape       ScrapeConfig  `yaml:"scrape"`
	// ReloadInterval is how often the config file's mtime is polled for
	// hot reload; default 1s, negative disables.
	ReloadInterval time.Duration `yaml:"reload_interval"`

	// Scheduler is the scheduling profile (see docs/tier1-scheduling.md);
	// absent means picker.DefaultProfile().
	Scheduler picker.ProfileConfig `yaml:"scheduler"`

	// Consul, when its address is set, registers this Tier 1 so that Tier 2
	// finds it (service infergate-tier1).
	Consul ConsulConfig `yaml:"consul"`

	// Peers shares routing state with the cluster's other Tier 1 replicas
	// (docs/tier1-replicas.md); off while peers.listen is empty.
	Peers PeersConfig `yaml:"peers"`

	Pools  []PoolConfig  `yaml:"pools"`
	Models []ModelConfig `yaml:"models"`
	Pods   []PodConfig   `yaml:"pods"`

	// Kubernetes discovers pods from the Kubernetes API beside the static
	// Pods (tier1/kube, docs/deploy-kubernetes.md). Read at start; a change
	// needs a restart.
	Kubernetes KubernetesConfig `yaml:"kubernetes"`

	// Tracing exports OpenTelemetry spans (docs/tracing.md); off by
	// default. Read at start; a change needs a restart.
	Tracing tracing.Config `yaml:"tracing"`

	// Status is the status page on the metrics listener
	// (docs/operations.md).
	Status StatusConfig `yaml:"status"`

	// KVEvents follows the model servers' KV-cache events (vLLM's
	// --kv-events-config) and keeps an exact per-pod prefix index, which
	// the prefix scorers use for pods whose events are fresh, falling back
	// pod by pod to the approximate index (docs/kv-events.md). Off by
	// default: routing is then the approximate index's alone. Read at
	// start; a change needs a restart (the pods it follows track the
	// configuration and discovery).
	KVEvents KVEventsConfig `yaml:"kv_events"`
}

// KVEventsConfig is the kv_events block (tier1/kvevents' schema).
type KVEventsConfig = kvevents.Config

// TokenizerConfig is a pool's tokenizer block (tier1/tokenize's schema).
type TokenizerConfig = tokenize.Config

// StatusConfig sizes what the status page keeps.
type StatusConfig struct {
	// Decisions is how many recent routing decisions are kept for
	// /status and /debug/decisions; default 200.
	Decisions int `yaml:"decisions"`
}

// KubernetesConfig is Kubernetes pod discovery; it is on when Sources is
// not empty.
type KubernetesConfig struct {
	// Namespace to watch; default the router's own (in a pod), else
	// "default". Discovery never watches across namespaces.
	Namespace string `yaml:"namespace"`
	// Kubeconfig is a kubeconfig file; default the in-cluster service
	// account.
	Kubeconfig string `yaml:"kubeconfig" config:"file"`
	// NodeGPU reads a pod's GPU from its node's nvidia.com/gpu.product
	// label when the pod does not carry infergate.io/gpu. It needs `get
	// nodes`, a cluster-scoped permission, so it is off by default.
	NodeGPU bool              `yaml:"node_gpu"`
	Sources []DiscoverySource `yaml:"sources"`
}

// DiscoverySource selects pods: through a Gateway API Inference Extension
// InferencePool, or by label selector and port.
type DiscoverySource struct {
	// Pool is the infergate pool the pods join unless they carry the
	// infergate.io/pool label; default the only configured pool.
	Pool string `yaml:"pool"`
	// InferencePool names an inference.networking.k8s.io/v1 InferencePool
	// in Namespace; its selector and first target port are used.
	InferencePool string `yaml:"inference_pool"`
	// Selector is a label selector (app=vllm,tier in (a,b)) for clusters
	// without the InferencePool CRD; Port is then required.
	Selector string `yaml:"selector"`
	// Port is the model server's port; with InferencePool it overrides
	// the pool's targetPorts.
	Port int `yaml:"port"`
}

// AuthConfig controls client authentication. Auth is on by default: with
// no token source configured the file is rejected unless disabled: true.
type AuthConfig struct {
	// Disabled turns client authentication off; it must be said
	// explicitly, as no token source is otherwise an error.
	Disabled bool `yaml:"disabled"`
	// Tokens are accepted bearer tokens written inline (prefer TokenEnv or
	// TokenFile so secrets stay out of config files).
	Tokens []string `yaml:"tokens"`
	// TokenEnv names an environment variable holding comma-separated
	// tokens.
	TokenEnv string `yaml:"token_env"`
	// TokenFile is a file with one token per line (# comments allowed);
	// re-read on every reload, so tokens rotate without restart.
	TokenFile string `yaml:"token_file"`
	// TrustPriorityHeader lets authenticated clients set
	// x-infergate-priority. Never honoured when auth is disabled.
	TrustPriorityHeader bool `yaml:"trust_priority_header"`
}

// UpstreamConfig is how the router reaches and authenticates to model
// servers (vLLM --api-key). The client's own Authorization header is never
// forwarded.
type UpstreamConfig struct {
	// TokenEnv or TokenFile holds the bearer token sent to pods (vLLM
	// --api-key); TokenFile's first line wins over TokenEnv.
	TokenEnv  string `yaml:"token_env"`
	TokenFile string `yaml:"token_file"`
	// Scheme is "http" (default) or "https" (pods serving TLS, such as
	// vLLM started with --ssl-certfile), for proxying and scraping alike,
	// static and discovered pods alike. Read at start.
	Scheme string `yaml:"scheme"`
	// TLS is the https client's configuration: the CA bundle pods'
	// certificates are verified against (default the system roots) and
	// an optional client certificate. Only with scheme https.
	TLS tlsfiles.Client `yaml:"tls"`
}

// TimeoutConfig bounds each stage of a proxied request.
type TimeoutConfig struct {
	Connect   time.Duration `yaml:"connect"`    // dialling a pod; default 2s
	ReadBody  time.Duration `yaml:"read_body"`  // receiving the client's body (a trickling client gets 400); default 1m
	FirstByte time.Duration `yaml:"first_byte"` // dispatch to the pod's first response byte; default 5m
	Idle      time.Duration `yaml:"idle"`       // longest silence inside a response; default 2m
	Request   time.Duration `yaml:"request"`    // whole request, queueing included; default 30m
	// The client side of every listener (docs/tier1.md#timeouts):
	ReadHeader time.Duration `yaml:"read_header"` // a request's headers (and the ext_proc HTTP/2 handshake); default 10s
	ClientIdle time.Duration `yaml:"client_idle"` // a keep-alive connection between requests; default 2m
	Write      time.Duration `yaml:"write"`       // each write to the client; one that stops reading is dropped; default 30s
	MaxStream  time.Duration `yaml:"max_stream"`  // a relayed response in all, from the request's arrival; default 30m
}

// RetryConfig bounds retries on the next-best pod when a pod fails before
// its first response byte, by the rule both tiers share: a connect error,
// a timeout, or a status shared/relay.Retryable accepts (5xx, 429, 404,
// 401/403).
type RetryConfig struct {
	MaxAttempts int           `yaml:"max_attempts" config:"min=1"` // attempts in total; default 3, 1 disables retry
	Budget      time.Duration `yaml:"budget"`                      // no new attempt after this since the first; default 10s
}

// QueueConfig is the router's own queue, used when every candidate pod is
// saturated. Sheddable requests are rejected with 429 instead of queued.
type QueueConfig struct {
	MaxLen int `yaml:"max_len"` // waiting requests per pool; beyond, requests skip the wait; default 1024
	// MaxWait is the longest a standard (priority 0) request waits for a
	// pod to leave saturation; then it is dispatched to the best pod
	// anyway (the server queues it). Default 2s.
	MaxWait time.Duration `yaml:"max_wait"`
	// CriticalMaxWait is MaxWait for priority > 0 requests, which also go
	// ahead of standard ones in the queue. Default 10s.
	CriticalMaxWait time.Duration `yaml:"critical_max_wait"`
}

// ScrapeConfig sets how pods are polled.
type ScrapeConfig struct {
	Interval       time.Duration `yaml:"interval"`        // how often each pod's /metrics is scraped; default 50ms
	Timeout        time.Duration `yaml:"timeout"`         // how long one scrape may take; default 1s
	ModelsInterval time.Duration `yaml:"models_interval"` // how often each pod's /v1/models is read; default 5s
	// UnreadyAfter consecutive failed scrapes mark a pod not ready;
	// default 2.
	UnreadyAfter int `yaml:"unready_after" config:"min=1"`
	// IdleInterval is the /metrics period of a pod with no traffic
	// through this router (none in flight, none dispatched in the last
	// 2s); its first request brings it back to Interval. Default 1s, or
	// Interval if longer; equal to Interval scrapes every pod every
	// Interval.
	IdleInterval time.Duration `yaml:"idle_interval"`
}

// PoolConfig is a named set of pods serving one base model.
type PoolConfig struct {
	Name  string `yaml:"name"`  // required, unique; pods name it in pool
	Model string `yaml:"model"` // base model name clients use
	// Adapters are LoRA adapters of Model served by the pool's pods, in
	// addition to those the pods list in /v1/models.
	Adapters []string `yaml:"adapters"`
	// Tokenizer names the model's tokenizer files (docs/tokenizers.md)
	// for the exact token ids precise prefix routing matches on: with
	// kv_events on, requests for the pool's model and its adapters
	// (which share their base model's tokenizer) are tokenized in process.
	// Without one the pool's prefix evidence stays the approximate index,
	// except for prompts sent as token ids. Loaded at start and when the
	// block changes on reload; unused (not loaded) with kv_events off.
	Tokenizer TokenizerConfig `yaml:"tokenizer"`
}

// ModelConfig is per-model request policy; Name is a base model or an
// adapter (which then needs Base unless a pool lists it).
type ModelConfig struct {
	Name      string        `yaml:"name"`      // a pool's model or an adapter; required
	Base      string        `yaml:"base"`      // base model of an adapter
	Priority  int           `yaml:"priority"`  // higher first; < 0 is sheddable
	Sheddable bool          `yaml:"sheddable"` // rejected with 429 when saturated
	TTFTSLO   time.Duration `yaml:"ttft_slo"`  // the TTFT objective of requests without an x-infergate-ttft-slo-ms header; 0 = none
}

// PodConfig is one model-server pod (static discovery).
type PodConfig struct {
	Name    string `yaml:"name"`    // required, unique: the metrics label and the pod response header
	Address string `yaml:"address"` // host:port; required, unique
	Pool    string `yaml:"pool"`    // the pool it serves; required
	Engine  string `yaml:"engine"`  // vllm, vllm-legacy, sglang, tgi; "" detects
	GPU     string `yaml:"gpu"`     // GPU class (h100, l4, ...), passed to the scheduler
	// GPUs is how many GPUs the pod's engine runs on (tensor × pipeline
	// parallel); 0 = unknown. With GPU it names the pod's hardware class,
	// whose pods share a pooled prefill-speed estimate (the scheduler
	// profile's speed_pooling).
	GPUs   int               `yaml:"gpus"`
	Labels map[string]string `yaml:"labels"` // free-form, passed to the scheduler
	// KVEventsPort and KVEventsReplayPort override kv_events.port and
	// kv_events.replay_port for this pod (connect mode); 0 keeps them,
	// KVEventsReplayPort -1 turns replay off for the pod. Discovered pods
	// take them from the infergate.io/kv-events-port and
	// infergate.io/kv-events-replay-port annotations.
	KVEventsPort       int `yaml:"kv_events_port"`
	KVEventsReplayPort int `yaml:"kv_events_replay_port"`
}

// Defaults.
const (
	DefaultListen         = "127.0.0.1:8080"
	DefaultMetricsListen  = "127.0.0.1:9090"
	DefaultPodHeader      = "x-infergate-pod"
	DefaultMaxBodyBytes   = 16 << 20
	DefaultReloadInterval = time.Second
	// DefaultStatusDecisions is status.decisions' default.
	DefaultStatusDecisions = 200
)

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Cluster == "" {
		c.Cluster = "local"
	}
	if c.Region == "" {
		c.Region = "local"
	}
	if c.PodHeader == "" {
		c.PodHeader = DefaultPodHeader
	}
	if c.Upstream.Scheme == "" {
		c.Upstream.Scheme = "http"
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	def(&c.Timeouts.Connect, 2*time.Second)
	def(&c.Timeouts.ReadBody, time.Minute)
	def(&c.Timeouts.FirstByte, 5*time.Minute)
	def(&c.Timeouts.Idle, 2*time.Minute)
	def(&c.Timeouts.Request, 30*time.Minute)
	def(&c.Timeouts.ReadHeader, 10*time.Second)
	def(&c.Timeouts.ClientIdle, 2*time.Minute)
	def(&c.Timeouts.Write, 30*time.Second)
	def(&c.Timeouts.MaxStream, 30*time.Minute)
	if c.MetricsListen == "" {
		c.MetricsListen = DefaultMetricsListen
	}
	if c.Retry.MaxAttempts == 0 {
		c.Retry.MaxAttempts = 3
	}
	def(&c.Retry.Budget, 10*time.Second)
	if c.Queue.MaxLen == 0 {
		c.Queue.MaxLen = 1024
	}
	def(&c.Queue.MaxWait, 2*time.Second)
	def(&c.Queue.CriticalMaxWait, 10*time.Second)
	def(&c.Scrape.Interval, 50*time.Millisecond)
	def(&c.Scrape.IdleInterval, max(time.Second, c.Scrape.Interval))
	def(&c.Scrape.Timeout, time.Second)
	def(&c.Scrape.ModelsInterval, 5*time.Second)
	if c.Scrape.UnreadyAfter == 0 {
		c.Scrape.UnreadyAfter = 2
	}
	def(&c.ReloadInterval, DefaultReloadInterval)
	if c.Status.Decisions == 0 {
		c.Status.Decisions = DefaultStatusDecisions
	}
	if isZeroProfile(c.Scheduler) {
		c.Scheduler = picker.DefaultProfile()
	}
	c.Scheduler.SetDefaults()
	c.KVEvents.SetDefaults()
}

func isZeroProfile(p picker.ProfileConfig) bool {
	return p.Base == "" && p.Filters == nil && p.Scorers == nil && p.Picker == ""
}

// Validate checks the configuration after defaults.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		add("listen %q: %v", c.Listen, err)
	}
	if !c.Auth.Disabled && len(c.Auth.Tokens) == 0 && c.Auth.TokenEnv == "" && c.Auth.TokenFile == "" {
		add("auth: no token source; set auth.tokens, auth.token_env or auth.token_file, or disable auth explicitly with auth: {disabled: true}")
	}
	if c.MaxBodyBytes < 0 {
		add("max_body_bytes %d is negative", c.MaxBodyBytes)
	}
	for name, d := range map[string]time.Duration{
		"timeouts.connect": c.Timeouts.Connect, "timeouts.first_byte": c.Timeouts.FirstByte,
		"timeouts.read_body": c.Timeouts.ReadBody,
		"timeouts.idle":      c.Timeouts.Idle, "timeouts.request": c.Timeouts.Request,
		"timeouts.read_header": c.Timeouts.ReadHeader, "timeouts.client_idle": c.Timeouts.ClientIdle,
		"timeouts.write": c.Timeouts.Write, "timeouts.max_stream": c.Timeouts.MaxStream,
		"retry.budget": c.Retry.Budget, "queue.max_wait": c.Queue.MaxWait,
		"queue.critical_max_wait": c.Queue.CriticalMaxWait, "scrape.interval": c.Scrape.Interval,
		"scrape.idle_interval": c.Scrape.IdleInterval, "scrape.timeout": c.Scrape.Timeout, "scrape.models_interval": c.Scrape.ModelsInterval,
	} {
		if d < 0 {
			add("%s %v is negative", name, d)
		}
	}
	if c.Consul.Cost < 0 {
		add("consul.cost %v is negative", c.Consul.Cost)
	}
	if u := c.Consul.CostUnit; u != "" && u != "gpu-hour" && u != "mtok" {
		add("consul.cost_unit %q: want gpu-hour or mtok", u)
	}
	if c.Consul.ServicePort < 0 || c.Consul.ServicePort > 65535 {
		add("consul.service_port %d out of range", c.Consul.ServicePort)
	}
	errs = append(errs, c.validateTLS()...)
	if c.Retry.MaxAttempts < 1 {
		add("retry.max_attempts %d must be at least 1", c.Retry.MaxAttempts)
	}
	if c.Queue.MaxLen < 0 {
		add("queue.max_len %d is negative", c.Queue.MaxLen)
	}
	if c.Status.Decisions < 1 || c.Status.Decisions > 10000 {
		add("status.decisions %d: want 1 to 10000", c.Status.Decisions)
	}
	if c.Scrape.UnreadyAfter < 1 {
		add("scrape.unready_after %d must be at least 1", c.Scrape.UnreadyAfter)
	}
	if c.Scrape.IdleInterval >= 0 && c.Scrape.IdleInterval < c.Scrape.Interval {
		add("scrape.idle_interval %v is shorter than scrape.interval %v (set it equal to scrape every pod every interval)",
			c.Scrape.IdleInterval, c.Scrape.Interval)
	}
	errs = append(errs, c.validateScheduler())
	if err := c.Tracing.Validate(); err != nil {
		errs = append(errs, err)
	}

	errs = append(errs, c.validateModels()...)
	errs = append(errs, c.listenClashes())
	pools := map[string]bool{}
	for _, p := range c.Pools {
		pools[p.Name] = true
	}
	for i, src := range c.Kubernetes.Sources {
		switch {
		case (src.InferencePool == "") == (src.Selector == ""):
			add("kubernetes.sources[%d]: set exactly one of inference_pool and selector", i)
		case src.Selector != "" && src.Port == 0:
			add("kubernetes.sources[%d]: selector needs port", i)
		}
		if src.Port < 0 || src.Port > 65535 {
			add("kubernetes.sources[%d]: port %d out of range", i, src.Port)
		}
		switch {
		case src.Pool != "" && !pools[src.Pool]:
			add("kubernetes.sources[%d]: unknown pool %q", i, src.Pool)
		case src.Pool == "" && len(c.Pools) != 1:
			add("kubernetes.sources[%d]: pool is required when %d pools are configured", i, len(c.Pools))
		}
	}
	errs = append(errs, c.Peers.validate(c.Consul.Address != "")...)
	errs = append(errs, c.validateKVEvents()...)
	return errors.Join(errs...)
}

// validateModels checks pools, models and pods: names, what serves which
// model, addresses. Errors are at the key (pods[2].address).
func (c *Config) validateModels() []error {
	var errs []error
	at := func(path, format string, args ...any) { errs = append(errs, loader.Errorf(path, format, args...)) }
	pools := map[string]int{}
	served := map[string]string{} // model name -> the key that declares it
	for i, p := range c.Pools {
		path := loader.Index("pools", i)
		switch j, dup := pools[p.Name]; {
		case p.Name == "":
			at(path+".name", "required")
			continue
		case dup:
			at(path+".name", "duplicate pool %q (also pools[%d])", p.Name, j)
			continue
		case p.Model == "":
			at(path+".model", "required: the base model name clients send (pool %s)", p.Name)
		}
		pools[p.Name] = i
		if prev, ok := served[p.Model]; ok && p.Model != "" {
			at(path+".model", "%q is already served by %s", p.Model, prev)
		}
		served[p.Model] = path + ".model"
	}
	for i, p := range c.Pools {
		for j, a := range p.Adapters {
			path := loader.Index(loader.Index("pools", i)+".adapters", j)
			if prev, ok := served[a]; ok {
				at(path, "adapter %q is already declared by %s", a, prev)
				continue
			}
			served[a] = path
		}
	}
	seenModel := map[string]int{}
	for i, m := range c.Models {
		path := loader.Index("models", i)
		if m.Name == "" {
			at(path+".name", "required")
			continue
		}
		if j, ok := seenModel[m.Name]; ok {
			at(path+".name", "duplicate model %q (also models[%d])", m.Name, j)
		}
		seenModel[m.Name] = i
		if m.TTFTSLO < 0 {
			at(path+".ttft_slo", "%v is negative (0: no objective)", m.TTFTSLO)
		}
		if m.Base != "" {
			if !c.isPoolModel(m.Base) {
				at(path+".base", "%q is not the model of any pool (pools serve: %s)", m.Base, c.poolModels())
			}
			if c.isPoolModel(m.Name) {
				at(path+".base", "%q is a pool's base model and cannot have a base", m.Name)
			}
		}
	}
	seenPod := map[string]int{}
	seenAddr := map[string]int{}
	for i, p := range c.Pods {
		path := loader.Index("pods", i)
		if p.Name == "" {
			at(path+".name", "required")
		} else if j, ok := seenPod[p.Name]; ok {
			at(path+".name", "duplicate pod %q (also pods[%d])", p.Name, j)
		} else {
			seenPod[p.Name] = i
		}
		if _, port, err := net.SplitHostPort(p.Address); err != nil || port == "" {
			at(path+".address", "%q is not host:port", p.Address)
		} else if j, ok := seenAddr[p.Address]; ok {
			at(path+".address", "%q is also pods[%d]'s address (%s): one server would be counted twice", p.Address, j, c.Pods[j].Name)
		} else {
			seenAddr[p.Address] = i
		}
		if _, ok := pools[p.Pool]; !ok {
			at(path+".pool", "unknown pool %q (pools: %s)", p.Pool, c.poolNames())
		}
		if p.Engine != "" && !isEngine(p.Engine) {
			at(path+".engine", "unknown engine %q (known: %s, or empty to detect)", p.Engine, strings.Join(scrape.Engines, ", "))
		}
		if p.GPUs < 0 {
			at(path+".gpus", "%d is negative (0: unknown)", p.GPUs)
		}
	}
	return errs
}

func (c *Config) poolModels() string {
	return loader.List(c.Pools, func(p PoolConfig) string { return strconv.Quote(p.Model) }, "no pool is configured")
}

func (c *Config) poolNames() string {
	return loader.List(c.Pools, func(p PoolConfig) string { return p.Name }, "none configured")
}

// validateScheduler locates the scheduling profile's problems: a scorer's
// at its entry in the file (the profile is merged onto its base, so the
// index is found by name).
func (c *Config) validateScheduler() error {
	var out []error
	for _, e := range splitErrors(c.Scheduler.Validate()) {
		msg := e.Error()
		switch m := scorerMsg.FindStringSubmatch(msg); {
		case m != nil:
			out = append(out, loader.Errorf("scheduler.scorers[name="+m[1]+"]", "%s", msg))
		case strings.HasPrefix(msg, "unknown filter"):
			out = append(out, loader.Errorf("scheduler.filters", "%s", msg))
		case strings.HasPrefix(msg, "unknown picker"):
			out = append(out, loader.Errorf("scheduler.picker", "%s", msg))
		case strings.HasPrefix(msg, "saturation"):
			out = append(out, loader.Errorf("scheduler.saturation", "%s", msg))
		default:
			out = append(out, loader.At("scheduler", e))
		}
	}
	return errors.Join(out...)
}

// scorerMsg finds the scorer a picker error is about.
var scorerMsg = regexp.MustCompile(`^(?:unknown )?scorer "([^"]*)"`)

func splitErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// listenClashes reports two listeners of this file on one address.
func (c *Config) listenClashes() error {
	addrs := []loader.Listener{{Path: "listen", Addr: c.Listen}}
	if c.MetricsListen != "-" {
		addrs = append(addrs, loader.Listener{Path: "metrics_listen", Addr: c.MetricsListen})
	}
	if c.Peers.Listen != "" {
		addrs = append(addrs, loader.Listener{Path: "peers.listen", Addr: c.Peers.Listen})
	}
	return loader.ListenClashes(addrs)
}

// validateKVEvents checks the kv_events block, the pools' tokenizer
// blocks, the pods' kv_events ports and the prefix scorers that read
// them. Errors name the key.
func (c *Config) validateKVEvents() []error {
	var errs []error
	if err := c.KVEvents.Validate(); err != nil {
		// kvevents names keys relative to its block.
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				errs = append(errs, fmt.Errorf("kv_events.%w", e))
			}
		} else {
			errs = append(errs, fmt.Errorf("kv_events.%w", err))
		}
	}
	for i, p := range c.Pools {
		if !p.Tokenizer.IsZero() && p.Tokenizer.File == "" {
			errs = append(errs, fmt.Errorf("pools[%d].tokenizer.file: required (pool %s: the model's tokenizer.json)", i, p.Name))
		}
	}
	for i, p := range c.Pods {
		if p.KVEventsPort < 0 || p.KVEventsPort > 65535 {
			errs = append(errs, fmt.Errorf("pods[%d].kv_events_port: %d out of range 0-65535 (pod %s; 0: kv_events.port)", i, p.KVEventsPort, p.Name))
		}
		if p.KVEventsReplayPort < -1 || p.KVEventsReplayPort > 65535 {
			errs = append(errs, fmt.Errorf("pods[%d].kv_events_replay_port: %d out of range -1-65535 (pod %s; 0: kv_events.replay_port, -1: no replay)", i, p.KVEventsReplayPort, p.Name))
		}
	}
	prefixOn, preciseOn := false, false
	for _, s := range c.Scheduler.Scorers {
		switch {
		case !s.On():
		case s.Name == picker.ScorerPrefix:
			prefixOn = true
		case s.Name == picker.ScorerPrecisePrefix:
			preciseOn = true
		}
	}
	if preciseOn && !c.KVEvents.Enabled {
		errs = append(errs, fmt.Errorf("scheduler.scorers: %s needs kv_events.enabled: true (without KV events it is the approximate %s scorer)", picker.ScorerPrecisePrefix, picker.ScorerPrefix))
	}
	if preciseOn && prefixOn {
		errs = append(errs, fmt.Errorf("scheduler.scorers: %s and %s are one scorer (%s uses the exact index too when kv_events is on); enable one, e.g. {name: %s, enabled: false}", picker.ScorerPrefix, picker.ScorerPrecisePrefix, picker.ScorerPrefix, picker.ScorerPrefix))
	}
	return errs
}

// validateTLS checks the TLS blocks and the schemes that must agree with
// them.
func (c *Config) validateTLS() []error {
	errs := tlsfiles.ValidateListeners([]tlsfiles.Listener{
		{Key: "tls", Block: c.TLS}, {Key: "metrics_tls", Block: c.MetricsTLS}, {Key: "ext_proc_tls", Block: c.ExtProcTLS},
	})
	if err := c.Upstream.TLS.Validate("upstream.tls"); err != nil {
		errs = append(errs, err)
	}
	switch c.Upstream.Scheme {
	case "http":
		if c.Upstream.TLS.Enabled() {
			errs = append(errs, errors.New("upstream.tls is set but upstream.scheme is http; set upstream.scheme: https"))
		}
	case "https":
	default:
		errs = append(errs, fmt.Errorf("upstream.scheme %q: want http or https", c.Upstream.Scheme))
	}
	switch s := c.Consul.Scheme; {
	case s != "" && s != "http" && s != "https":
		errs = append(errs, fmt.Errorf("consul.scheme %q: want http or https", s))
	case s == "http" && c.TLS.Enabled():
		// Tier 2 would dial plain HTTP into a TLS listener.
		errs = append(errs, errors.New("consul.scheme is http but tls serves the API over https; remove consul.scheme (https is registered automatically)"))
	}
	return errs
}

func (c *Config) isPoolModel(name string) bool {
	for _, p := range c.Pools {
		if p.Model == name {
			return true
		}
	}
	return false
}

func isEngine(e string) bool {
	for _, k := range scrape.Engines {
		if k == e {
			return true
		}
	}
	return false
}

// ResolveTokens returns the accepted client tokens from every configured
// source. With auth enabled, no token at all is an error.
func (a AuthConfig) ResolveTokens() ([]string, error) {
	if a.Disabled {
		return nil, nil
	}
	tokens := append([]string(nil), a.Tokens...)
	if a.TokenEnv != "" {
		tokens = append(tokens, strings.Split(os.Getenv(a.TokenEnv), ",")...)
	}
	if a.TokenFile != "" {
		fileTokens, err := readTokenFile(a.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("auth.token_file: %w", err)
		}
		tokens = append(tokens, fileTokens...)
	}
	out := tokens[:0]
	for _, t := range tokens {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		// Never name the values; only where they were expected.
		return nil, fmt.Errorf("auth is enabled but no token was found (tokens: %d inline, token_env %q, token_file %q)",
			len(a.Tokens), a.TokenEnv, a.TokenFile)
	}
	return out, nil
}

// ResolveToken returns the token to send to model servers, "" for none.
func (u UpstreamConfig) ResolveToken() (string, error) {
	if u.TokenFile != "" {
		ts, err := readTokenFile(u.TokenFile)
		if err != nil {
			return "", fmt.Errorf("upstream.token_file: %w", err)
		}
		if len(ts) > 0 {
			return ts[0], nil
		}
	}
	if u.TokenEnv != "" {
		return strings.TrimSpace(os.Getenv(u.TokenEnv)), nil
	}
	return "", nil
}

func readTokenFile(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	return out, nil
}

// Pool returns the named pool, or nil.
func (c *Config) Pool(name string) *PoolConfig {
	for i := range c.Pools {
		if c.Pools[i].Name == name {
			return &c.Pools[i]
		}
	}
	return nil
}

// ConsulConfig registers the router in Consul for Tier 2's discovery.
// Registration is off while Address is empty.
type ConsulConfig struct {
	Address   string `yaml:"address"`    // Consul agent HTTP address, e.g. 127.0.0.1:8500
	TokenEnv  string `yaml:"token_env"`  // environment variable holding the ACL token
	TokenFile string `yaml:"token_file"` // file holding the ACL token
	// ServiceAddress and ServicePort are what Tier 2 dials; default the
	// listen address.
	ServiceAddress string        `yaml:"service_address"`
	ServicePort    int           `yaml:"service_port"`
	Scheme         string        `yaml:"scheme"`         // http, or https (the default when tls is set)
	Cost           float64       `yaml:"cost"`           // the cluster's cost in CostUnit, for cost-first routing
	CostUnit       string        `yaml:"cost_unit"`      // gpu-hour (default) or mtok
	Pricing        string        `yaml:"pricing"`        // spot or on-demand, informational
	Capacity       int           `yaml:"capacity"`       // concurrent requests the cluster is sized for
	Tags           []string      `yaml:"tags"`           // extra Consul tags on the registration
	CheckInterval  time.Duration `yaml:"check_interval"` // the interval of the Consul health check; default 5s
}

// ResolveToken returns the Consul ACL token, "" for none.
func (c ConsulConfig) ResolveToken() (string, error) {
	if c.TokenEnv != "" {
		if v := os.Getenv(c.TokenEnv); v != "" {
			return v, nil
		}
	}
	if c.TokenFile != "" {
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return "", fmt.Errorf("consul.token_file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return "", nil
}
