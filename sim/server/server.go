// Package server is one simulated GPU pod behind an OpenAI-compatible HTTP
// API: chat and text completions (streaming or not), the Responses and
// Anthropic Messages APIs, embeddings, model listing, vLLM's
// LoRA load/unload endpoints, /health, and a Prometheus page named as the
// imitated model server (vLLM, SGLang, TGI, trtllm-serve or a Dynamo
// frontend) names its metrics. The work
// itself is done by sim/engine, driven in real time.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/sim/kvpub"
	"github.com/infergate/infergate/sim/profile"
)

// Defaults for Config's zero fields.
const (
	DefaultModel        = "llama-3.1-8b"
	DefaultGPU          = "h100"
	DefaultMaxBodyBytes = 8 << 20
	// DefaultOutputTokens is where a simulated model stops (finish reason
	// "stop") when the client sets no max_tokens.
	DefaultOutputTokens = 128
)

// LoRAModule is an adapter registered at start, as vLLM's --lora-modules
// name=path.
type LoRAModule struct {
	Name string `yaml:"name"`
	Path string `yaml:"path"`
}

// ParseLoRAModule parses a --lora-modules value: "name=path", or a bare
// name (the path is then the name).
func ParseLoRAModule(s string) (LoRAModule, error) {
	name, path, hasPath := strings.Cut(strings.TrimSpace(s), "=")
	name, path = strings.TrimSpace(name), strings.TrimSpace(path)
	if name == "" || (hasPath && path == "") {
		return LoRAModule{}, fmt.Errorf("invalid LoRA module %q: want name=path or name", s)
	}
	if !hasPath {
		path = name
	}
	return LoRAModule{Name: name, Path: path}, nil
}

// Config configures one simulated pod.
type Config struct {
	// Name identifies the pod in logs (default: ServedModelName@GPU).
	Name string
	// Model is the model profile (sim/profile), e.g. "llama-3.1-8b".
	Model string
	// ServedModelName is the name clients use (default: Model).
	ServedModelName string
	// GPU is the GPU profile, e.g. "h100", "a10g".
	GPU string
	// Flavor picks the /metrics names (default vllm).
	Flavor Flavor
	// TensorParallel, MaxNumSeqs and MaxLoras are as vLLM's flags; zero
	// picks the engine's default.
	TensorParallel int
	MaxNumSeqs     int
	MaxLoras       int
	// LoRAModules are registered at start.
	LoRAModules []LoRAModule
	// TimeScale is real seconds per simulated second (default 1; 0.1 runs
	// ten times faster than a real GPU).
	TimeScale float64
	// MaxBodyBytes caps request bodies; larger ones get 413.
	MaxBodyBytes int64
	// DefaultOutputTokens: see the constant.
	DefaultOutputTokens int
	// Tune, if set, adjusts the engine configuration before the engine is
	// built (tests use it to shrink the KV cache).
	Tune func(*engine.Config)
	// Logger receives the pod's logs (default slog.Default()).
	Logger *slog.Logger
	// KVEvents, when its Endpoint is set, publishes the pod's KV-cache
	// events over ZeroMQ as vLLM does (sim/kvpub; off by default).
	KVEvents kvpub.Config
}

func (c *Config) setDefaults() {
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.ServedModelName == "" {
		c.ServedModelName = c.Model
	}
	if c.GPU == "" {
		c.GPU = DefaultGPU
	}
	if c.Flavor == "" {
		c.Flavor = FlavorVLLM
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.DefaultOutputTokens == 0 {
		c.DefaultOutputTokens = DefaultOutputTokens
	}
	if c.Name == "" {
		c.Name = c.ServedModelName + "@" + c.GPU
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Server is one simulated pod. Create it with New, then Serve it.
type Server struct {
	cfg       Config
	log       *slog.Logger
	eng       *engine.Engine
	rt        *engine.Realtime
	maxLen    int
	created   int64
	metrics   *collector
	registry  *prometheus.Registry
	handler   http.Handler
	nextID    atomic.Uint64
	closing   chan struct{} // closed when the pod shuts down
	closeOnce sync.Once

	mu       sync.Mutex
	adapters map[string]string // registered adapter name → path

	kv   *kvSink // nil unless KV events are configured
	kvMu sync.Mutex
}

// New builds a pod from cfg. It fails on an unknown model, GPU or flavor,
// or an engine configuration the engine rejects.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	loraFlag := cfg.MaxLoras > 0 || len(cfg.LoRAModules) > 0
	if _, err := ParseFlavor(string(cfg.Flavor)); err != nil {
		return nil, err
	}
	if cfg.TimeScale < 0 {
		return nil, fmt.Errorf("time scale must be positive, got %v", cfg.TimeScale)
	}
	model, err := profile.Model(cfg.Model)
	if err != nil {
		return nil, err
	}
	gpu, err := profile.GPU(cfg.GPU)
	if err != nil {
		return nil, err
	}
	ecfg := engine.Config{
		Model:          model,
		GPU:            gpu,
		TensorParallel: cfg.TensorParallel,
		MaxNumSeqs:     cfg.MaxNumSeqs,
		MaxLoras:       cfg.MaxLoras,
	}
	adapters := make(map[string]string, len(cfg.LoRAModules))
	for _, m := range cfg.LoRAModules {
		if m.Name == "" {
			return nil, errors.New("lora module with an empty name")
		}
		if m.Name == cfg.ServedModelName {
			return nil, fmt.Errorf("lora module %q has the served model's name", m.Name)
		}
		if _, dup := adapters[m.Name]; dup {
			return nil, fmt.Errorf("lora module %q given twice", m.Name)
		}
		adapters[m.Name] = m.Path
		ecfg.Adapters = append(ecfg.Adapters, m.Name)
	}
	if cfg.Tune != nil {
		cfg.Tune(&ecfg)
	}
	eng, err := engine.New(ecfg)
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", cfg.Name, err)
	}
	// Report the engine's resolved defaults, not zeros.
	rc := eng.Config()
	cfg.TensorParallel, cfg.MaxNumSeqs, cfg.MaxLoras = rc.TensorParallel, rc.MaxNumSeqs, rc.MaxLoras
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger.With("pod", cfg.Name),
		eng:      eng,
		rt:       engine.NewRealtime(eng, cfg.TimeScale),
		maxLen:   eng.MaxModelLen(),
		created:  time.Now().Unix(),
		registry: prometheus.NewRegistry(),
		closing:  make(chan struct{}),
		adapters: adapters,
	}
	s.metrics = newCollector(collectorConfig{
		flavor:     cfg.Flavor,
		model:      cfg.ServedModelName,
		maxLen:     s.maxLen,
		gpuMemUtil: gpuMemUtil(eng.Config()),
		stats:      s.stats,
		// vLLM exports lora_requests_info only with LoRA enabled.
		loraOn: func() bool { return loraFlag || s.numAdapters() > 0 },
	})
	if err := s.registry.Register(s.metrics); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	if cfg.KVEvents.Endpoint != "" {
		s.kv = &kvSink{loraIDs: map[string]int{}}
		eng.SetKVEvents(s.kv)
	}
	s.handler = s.routes()
	return s, nil
}

func gpuMemUtil(c engine.Config) float64 {
	if c.GPUMemoryUtilization > 0 {
		return c.GPUMemoryUtilization
	}
	return engine.DefaultGPUMemoryUtilization
}

// Config returns the pod's configuration with defaults applied.
func (s *Server) Config() Config { return s.cfg }

// MaxModelLen is the longest prompt plus output the pod accepts.
func (s *Server) MaxModelLen() int { return s.maxLen }

// Handler is the pod's HTTP API.
func (s *Server) Handler() http.Handler { return s.handler }

// Stats returns a snapshot of the pod's engine.
func (s *Server) Stats() engine.Stats { return s.stats() }

func (s *Server) stats() engine.Stats {
	var st engine.Stats
	s.rt.Do(func(e *engine.Engine, _ time.Duration) { st = e.Stats() })
	return st
}

func (s *Server) numAdapters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.adapters)
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.handleGenerate(w, r, dChat) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.handleGenerate(w, r, dCompletions) })
	mux.HandleFunc("POST /v1/responses", func(w http.ResponseWriter, r *http.Request) { s.handleGenerate(w, r, dResponses) })
	// Anthropic Messages: its errors take that API's shape.
	mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) {
		s.handleGenerate(openai.AnthropicWriter{ResponseWriter: w}, r, dMessages)
	})
	mux.HandleFunc("POST /v1/messages/count_tokens", func(w http.ResponseWriter, r *http.Request) {
		s.handleCountTokens(openai.AnthropicWriter{ResponseWriter: w}, r)
	})
	mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("POST /v1/load_lora_adapter", s.handleLoadLoRA)
	mux.HandleFunc("POST /v1/unload_lora_adapter", s.handleUnloadLoRA)
	mux.HandleFunc("POST /reset_prefix_cache", s.handleResetPrefixCache)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET "+s.cfg.Flavor.MetricsPath(), promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	if s.cfg.Flavor == FlavorTRTLLM {
		// trtllm-serve's /metrics is JSON iteration stats, not Prometheus
		// text: a scraper asking it is told so by the shape.
		mux.HandleFunc("GET /metrics", s.handleIterationStats)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Unknown paths and methods get the OpenAI error envelope too.
		if _, pattern := mux.Handler(r); pattern == "" {
			openai.Errorf(w, http.StatusNotFound, "not_found", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Serve runs the engine and serves HTTP on ln until ctx ends, then shuts
// down: in-flight requests are cancelled, not awaited.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := s.openKVEvents(ctx); err != nil {
		return err
	}
	defer s.closeKVEvents()
	engineDone := make(chan struct{})
	go func() {
		defer close(engineDone)
		s.rt.Run(ctx)
	}()
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	s.log.Info("simulated pod listening", "addr", ln.Addr().String(), "model", s.cfg.ServedModelName,
		"profile", s.cfg.Model, "gpu", s.cfg.GPU, "engine", s.cfg.Flavor, "tp", s.cfg.TensorParallel,
		"max_model_len", s.maxLen, "time_scale", s.cfg.TimeScale)
	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	s.closeOnce.Do(func() { close(s.closing) })
	shutCtx, done := context.WithTimeout(context.Background(), 2*time.Second)
	defer done()
	if serr := hs.Shutdown(shutCtx); serr != nil {
		_ = hs.Close()
	}
	cancel()
	<-engineDone
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Pod is a Server listening on an address.
type Pod struct {
	*Server
	// Addr is host:port; URL is http://Addr.
	Addr, URL string
	cancel    context.CancelFunc
	done      chan error
	closeOnce sync.Once
	closeErr  error
}

// Listen builds a pod and serves it on addr ("127.0.0.1:0" picks a free
// port) until ctx ends or Close is called.
func Listen(ctx context.Context, cfg Config, addr string) (*Pod, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pod %s: listen: %w", s.cfg.Name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	if err := s.openKVEvents(ctx); err != nil {
		cancel()
		_ = ln.Close()
		return nil, err
	}
	p := &Pod{Server: s, Addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	p.URL = "http://" + p.Addr
	go func() { p.done <- s.Serve(ctx, ln) }()
	return p, nil
}

// Close stops the pod and waits for it. It may be called more than once.
func (p *Pod) Close() error {
	p.closeOnce.Do(func() {
		p.cancel()
		p.closeErr = <-p.done
	})
	return p.closeErr
}

// resolveModel maps a request's model to an adapter name ("" for the base).
func (s *Server) resolveModel(name string) (adapter string, ok bool) {
	if name == s.cfg.ServedModelName {
		return "", true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok = s.adapters[name]
	return name, ok
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	base := s.cfg.ServedModelName
	list := modelList{Object: "list", Data: []modelCard{{
		ID: base, Object: "model", Created: s.created, OwnedBy: "vllm", Root: s.cfg.Model, MaxModelLen: s.maxLen,
	}}}
	s.mu.Lock()
	names := make([]string, 0, len(s.adapters))
	for n := range s.adapters {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		root := s.adapters[n]
		if root == "" {
			root = n
		}
		list.Data = append(list.Data, modelCard{ID: n, Object: "model", Created: s.created, OwnedBy: "vllm", Root: root, Parent: &base})
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req loraRequest
	if aerr := decodeJSON(w, r, s.cfg.MaxBodyBytes, &req); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if req.LoraName == "" || req.LoraPath == "" {
		openai.Errorf(w, http.StatusBadRequest, "invalid_value", "both 'lora_name' and 'lora_path' must be provided")
		return
	}
	if req.LoraName == s.cfg.ServedModelName {
		openai.Errorf(w, http.StatusBadRequest, "invalid_value", fmt.Sprintf("the lora adapter '%s' has the base model's name", req.LoraName))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.adapters[req.LoraName]; ok {
		openai.Errorf(w, http.StatusBadRequest, "adapter_exists", fmt.Sprintf("The lora adapter '%s' has already been loaded.", req.LoraName))
		return
	}
	var err error
	s.rt.Do(func(e *engine.Engine, now time.Duration) { err = e.LoadAdapter(now, req.LoraName) })
	if err != nil && !errors.Is(err, engine.ErrAdapterExists) {
		openai.Errorf(w, http.StatusBadRequest, "invalid_value", err.Error())
		return
	}
	s.adapters[req.LoraName] = req.LoraPath
	s.log.Info("lora adapter loaded", "name", req.LoraName, "path", req.LoraPath)
	writeText(w, http.StatusOK, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.LoraName))
}

func (s *Server) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req loraRequest
	if aerr := decodeJSON(w, r, s.cfg.MaxBodyBytes, &req); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if req.LoraName == "" {
		openai.Errorf(w, http.StatusBadRequest, "invalid_value", "'lora_name' must be provided")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.adapters[req.LoraName]; !ok {
		openai.Errorf(w, http.StatusNotFound, "adapter_not_found", fmt.Sprintf("The lora adapter '%s' cannot be found.", req.LoraName))
		return
	}
	var err error
	s.rt.Do(func(e *engine.Engine, _ time.Duration) { err = e.UnloadAdapter(req.LoraName) })
	if err != nil && !errors.Is(err, engine.ErrUnknownAdapter) {
		openai.Errorf(w, http.StatusBadRequest, "invalid_value", err.Error())
		return
	}
	delete(s.adapters, req.LoraName)
	s.log.Info("lora adapter unloaded", "name", req.LoraName)
	writeText(w, http.StatusOK, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.LoraName))
}
