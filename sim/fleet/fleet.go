// Package fleet hosts many simulated pods (sim/server) in one process, each
// on its own loopback port, from a YAML description. `infergate-lab sim --fleet`
// and tests use it; so can `infergate-lab dev`.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/sim/kvpub"
	"github.com/infergate/infergate/sim/server"
)

// Config is a fleet file.
//
//	time_scale: 0.1           # real seconds per simulated second, for every pod
//	host: 127.0.0.1
//	pods:
//	  - name: llama-h100
//	    port: 8001            # 0 picks a free port
//	    model: llama-3.1-8b
//	    served_model_name: meta-llama/Llama-3.1-8B-Instruct
//	    gpu: h100
//	    engine: vllm          # vllm, vllm-legacy, sglang, tgi
//	    tp: 1
//	    max_num_seqs: 256
//	    lora_modules: ["sql-lora=/adapters/sql", "chat-lora"]
//	    max_loras: 4
//	    max_request_bytes: 8388608
//	    replicas: 2           # stamped out as llama-h100-0, llama-h100-1
//	    kv_events:            # publish KV-cache events as vLLM does (off when endpoint is empty)
//	      endpoint: "tcp://*:5557"        # bound (* or ::), else dialled; replicas count ports up
//	      replay_endpoint: "tcp://*:5567" # optional replay (ROUTER) socket, always bound; replicas count up too
//	      topic: ""           # {addr} and {model}: the pod's host:port and served model name
//	      legacy: false       # positional arrays instead of tagged maps
type Config struct {
	TimeScale float64   `yaml:"time_scale"`
	Host      string    `yaml:"host"`
	Pods      []PodSpec `yaml:"pods"`

	// Logger receives every pod's logs (default slog.Default()).
	Logger *slog.Logger `yaml:"-"`
}

// PodSpec describes one pod, or Replicas identical ones.
type PodSpec struct {
	Name            string   `yaml:"name"`
	Port            int      `yaml:"port"`
	Model           string   `yaml:"model"`
	ServedModelName string   `yaml:"served_model_name"`
	GPU             string   `yaml:"gpu"`
	Engine          string   `yaml:"engine"`
	TP              int      `yaml:"tp"`
	MaxNumSeqs      int      `yaml:"max_num_seqs"`
	LoRAModules     []string `yaml:"lora_modules"`
	MaxLoras        int      `yaml:"max_loras"`
	// MaxRequestBytes caps request bodies (larger get 413); 0: 8 MiB.
	MaxRequestBytes int64 `yaml:"max_request_bytes"`
	Replicas        int   `yaml:"replicas"`
	// KVEvents publishes the pod's KV-cache events over ZeroMQ (sim/kvpub)
	// when its endpoint is set.
	KVEvents KVEventsSpec `yaml:"kv_events"`
}

// KVEventsSpec is a pod's KV-event publisher, with vLLM's
// --kv-events-config fields. Endpoint is bound when its host is a
// wildcard (tcp://*:5557, vLLM's rule), else dialled (a router that binds,
// llm-d's topology). Replicas publish on consecutive ports (port + i) of
// Endpoint and ReplayEndpoint when the port is fixed.
type KVEventsSpec struct {
	Endpoint       string `yaml:"endpoint"`
	ReplayEndpoint string `yaml:"replay_endpoint"`
	// Topic is the first frame of every message; {addr} becomes the pod's
	// host:port and {model} its served model name (llm-d's topic is
	// kv@{addr}@{model}).
	Topic  string `yaml:"topic"`
	Legacy bool   `yaml:"legacy"`
}

// ServerConfig is the sim/kvpub configuration of the pod serving at addr
// (host:port) with model as its served name.
func (k KVEventsSpec) ServerConfig(addr, model string) kvpub.Config {
	if k.Endpoint == "" {
		return kvpub.Config{}
	}
	topic := strings.ReplaceAll(k.Topic, "{addr}", addr)
	return kvpub.Config{
		Endpoint:       k.Endpoint,
		Connect:        !kvpub.BindsEndpoint(k.Endpoint),
		ReplayEndpoint: k.ReplayEndpoint,
		Topic:          strings.ReplaceAll(topic, "{model}", model),
		Legacy:         k.Legacy,
	}
}

// Validate checks the endpoints; at names the pod in errors.
func (k KVEventsSpec) Validate(at string) []error {
	var errs []error
	if k.Endpoint == "" {
		if k.ReplayEndpoint != "" || k.Topic != "" || k.Legacy {
			errs = append(errs, fmt.Errorf("%s.endpoint: required when any other kv_events key is set", at))
		}
		return errs
	}
	for _, e := range []struct{ key, ep string }{{"endpoint", k.Endpoint}, {"replay_endpoint", k.ReplayEndpoint}} {
		if e.ep == "" {
			continue
		}
		if _, err := endpointPort(e.ep); err != nil {
			errs = append(errs, fmt.Errorf("%s.%s: %w", at, e.key, err))
		}
	}
	return errs
}

// endpointPort returns the port of a tcp://host:port endpoint.
func endpointPort(ep string) (int, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return 0, fmt.Errorf("%q: want tcp://host:port", ep)
	}
	_, port, err := net.SplitHostPort(rest)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", ep, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return 0, fmt.Errorf("%q: bad port %q", ep, port)
	}
	return n, nil
}

// offsetEndpoint is ep with its port moved up by i (a port of 0, picked by
// the system, stays 0).
func offsetEndpoint(ep string, i int) string {
	n, err := endpointPort(ep)
	if ep == "" || err != nil || n == 0 {
		return ep
	}
	host, _, _ := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(n+i))
}

// SetDefaults fills zero fields (config.Load calls it).
func (c *Config) SetDefaults() {
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	for i := range c.Pods {
		p := &c.Pods[i]
		if p.Model == "" {
			p.Model = server.DefaultModel
		}
		if p.GPU == "" {
			p.GPU = server.DefaultGPU
		}
		if p.Engine == "" {
			p.Engine = string(server.FlavorVLLM)
		}
		if p.Replicas == 0 {
			p.Replicas = 1
		}
		if p.Name == "" {
			p.Name = fmt.Sprintf("%s-%s-%d", p.Model, p.GPU, i)
		}
	}
}

// Validate checks the fleet after defaults (config.Load calls it).
func (c *Config) Validate() error {
	var errs []error
	if c.TimeScale < 0 {
		errs = append(errs, fmt.Errorf("time_scale: must be positive, got %v", c.TimeScale))
	}
	if len(c.Pods) == 0 {
		errs = append(errs, errors.New("pods: at least one pod is required"))
	}
	names := map[string]bool{}
	ports := map[int]string{}
	for i, p := range c.Pods {
		at := fmt.Sprintf("pods[%d] (%s)", i, p.Name)
		if p.Replicas < 1 {
			errs = append(errs, fmt.Errorf("%s: replicas must be at least 1, got %d", at, p.Replicas))
			continue
		}
		if p.Port < 0 || p.Port+p.Replicas-1 > 65535 {
			errs = append(errs, fmt.Errorf("%s: port %d out of range", at, p.Port))
		}
		if _, err := server.ParseFlavor(p.Engine); err != nil {
			errs = append(errs, fmt.Errorf("%s: engine: %w", at, err))
		}
		if p.TP < 0 || p.MaxNumSeqs < 0 || p.MaxLoras < 0 || p.MaxRequestBytes < 0 {
			errs = append(errs, fmt.Errorf("%s: tp, max_num_seqs, max_loras and max_request_bytes must not be negative", at))
		}
		for _, m := range p.LoRAModules {
			if _, err := server.ParseLoRAModule(m); err != nil {
				errs = append(errs, fmt.Errorf("%s: lora_modules: %w", at, err))
			}
		}
		errs = append(errs, p.KVEvents.Validate(fmt.Sprintf("pods[%d].kv_events", i))...)
		if strings.Contains(p.KVEvents.Topic, "{addr}") && p.Port == 0 {
			errs = append(errs, fmt.Errorf("pods[%d].kv_events.topic: {addr} needs a fixed port (pods[%d].port is 0)", i, i))
		}
		for _, r := range expand(p) {
			if names[r.Name] {
				errs = append(errs, fmt.Errorf("%s: duplicate pod name %q", at, r.Name))
			}
			names[r.Name] = true
			if r.Port != 0 {
				if other, dup := ports[r.Port]; dup {
					errs = append(errs, fmt.Errorf("%s: port %d already used by %s", at, r.Port, other))
				}
				ports[r.Port] = r.Name
			}
		}
	}
	return errors.Join(errs...)
}

// expand stamps out a spec's replicas: names get -0, -1, ... and fixed
// ports count up from Port.
func expand(p PodSpec) []PodSpec {
	if p.Replicas <= 1 {
		r := p
		r.Replicas = 1
		return []PodSpec{r}
	}
	out := make([]PodSpec, p.Replicas)
	for i := range out {
		r := p
		r.Replicas = 1
		r.Name = p.Name + "-" + strconv.Itoa(i)
		if p.Port != 0 {
			r.Port = p.Port + i
		}
		r.KVEvents.Endpoint = offsetEndpoint(p.KVEvents.Endpoint, i)
		r.KVEvents.ReplayEndpoint = offsetEndpoint(p.KVEvents.ReplayEndpoint, i)
		out[i] = r
	}
	return out
}

// Load reads and validates a fleet file (strict: unknown fields are errors).
func Load(path string) (Config, error) {
	var c Config
	if err := config.Load(path, &c); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Pod is one running pod of a fleet.
type Pod struct {
	// Spec is the pod's expanded spec (Replicas is 1, Name is unique).
	Spec PodSpec
	*server.Pod
}

// Fleet is a set of running pods.
type Fleet struct {
	Pods []*Pod
}

// Start starts every pod of cfg and returns once all listen. cfg need not
// come from Load: defaults are applied and it is validated here. On error
// the pods already started are stopped.
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	cfg.Pods = append([]PodSpec(nil), cfg.Pods...)
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	f := &Fleet{}
	for _, spec := range cfg.Pods {
		for _, r := range expand(spec) {
			scfg, err := r.serverConfig(cfg.TimeScale, cfg.Host, log)
			if err != nil {
				_ = f.Close()
				return nil, fmt.Errorf("fleet: pod %s: %w", r.Name, err)
			}
			p, err := server.Listen(ctx, scfg, net.JoinHostPort(cfg.Host, strconv.Itoa(r.Port)))
			if err != nil {
				_ = f.Close()
				return nil, fmt.Errorf("fleet: pod %s: %w", r.Name, err)
			}
			f.Pods = append(f.Pods, &Pod{Spec: r, Pod: p})
		}
	}
	return f, nil
}

func (p PodSpec) serverConfig(timeScale float64, host string, log *slog.Logger) (server.Config, error) {
	flavor, err := server.ParseFlavor(p.Engine)
	if err != nil {
		return server.Config{}, err
	}
	sc := server.Config{
		Name:            p.Name,
		Model:           p.Model,
		ServedModelName: p.ServedModelName,
		GPU:             p.GPU,
		Flavor:          flavor,
		TensorParallel:  p.TP,
		MaxNumSeqs:      p.MaxNumSeqs,
		MaxLoras:        p.MaxLoras,
		MaxBodyBytes:    p.MaxRequestBytes,
		TimeScale:       timeScale,
		Logger:          log,
	}
	served := p.ServedModelName
	if served == "" {
		served = p.Model
	}
	sc.KVEvents = p.KVEvents.ServerConfig(net.JoinHostPort(host, strconv.Itoa(p.Port)), served)
	for _, m := range p.LoRAModules {
		lm, err := server.ParseLoRAModule(m)
		if err != nil {
			return server.Config{}, err
		}
		sc.LoRAModules = append(sc.LoRAModules, lm)
	}
	return sc, nil
}

// Pod returns the running pod named name, or nil.
func (f *Fleet) Pod(name string) *Pod {
	for _, p := range f.Pods {
		if p.Spec.Name == name {
			return p
		}
	}
	return nil
}

// ByModel groups the pods by served model name (what a router pools on),
// in fleet order.
func (f *Fleet) ByModel() map[string][]*Pod {
	out := make(map[string][]*Pod)
	for _, p := range f.Pods {
		name := p.Config().ServedModelName
		out[name] = append(out[name], p)
	}
	return out
}

// String lists the pods, one per line: name, URL, model, GPU, engine.
func (f *Fleet) String() string {
	var b strings.Builder
	for _, p := range f.Pods {
		c := p.Config()
		fmt.Fprintf(&b, "%s\t%s\tmodel=%s\tgpu=%s\tengine=%s\ttp=%d\n", p.Spec.Name, p.URL, c.ServedModelName, c.GPU, c.Flavor, max(c.TensorParallel, 1))
	}
	return b.String()
}

// Close stops every pod and waits for them.
func (f *Fleet) Close() error {
	var errs []error
	for _, p := range f.Pods {
		if err := p.Close(); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", p.Spec.Name, err))
		}
	}
	return errors.Join(errs...)
}
