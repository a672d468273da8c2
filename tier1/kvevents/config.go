package kvevents

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/shared/config"
)

// Defaults for Config's zero fields.
const (
	DefaultPort            = 5557 // vLLM's documented publisher port
	DefaultMaxMessageBytes = 4 << 20
	DefaultMaxBlocksPerPod = 1 << 17
	DefaultStaleAfter      = 2 * time.Minute
	DefaultRebuildWindow   = 2 * time.Minute
	DefaultReplayTimeout   = 5 * time.Second
	DefaultMaxConnections  = 4096
	DefaultReconnectMax    = 30 * time.Second
	DefaultTopicPrefix     = "kv@"
)

// Annotations a pod may carry to override the configured ports (connect
// mode). The values are port numbers.
const (
	AnnotationPort       = "infergate.io/kv-events-port"
	AnnotationReplayPort = "infergate.io/kv-events-replay-port"
)

// Modes: who binds.
const (
	// ModeConnect: each pod's publisher binds (vLLM's tcp://*:5557) and
	// Tier 1 connects a SUB socket to every pod.
	ModeConnect = "connect"
	// ModeBind: Tier 1 binds one SUB socket and every pod's publisher
	// connects to it (llm-d's --zmq-endpoint); events are routed to pods
	// by topic kv@<pod-ip>:<port>@<model>.
	ModeBind = "bind"
)

// Config is the KV-events block of Tier 1's configuration (the lead
// embeds it; see docs/kv-events.md). The zero value is disabled.
type Config struct {
	Enabled bool   `yaml:"enabled"` // turns following KV-cache events on; off, prefix routing is approximate only
	Mode    string `yaml:"mode"`    // connect (default) or bind
	// Port and ReplayPort are the pods' publisher and replay (ROUTER)
	// ports in connect mode; a pod overrides them with pods[].kv_events_port
	// and kv_events_replay_port, or with the infergate.io/kv-events-port and
	// infergate.io/kv-events-replay-port annotations. ReplayPort 0 turns
	// replay off (vLLM's replay_endpoint is off by default); set it to the
	// pods' replay port so lost events are fetched, not rebuilt.
	Port       int `yaml:"port"`
	ReplayPort int `yaml:"replay_port"`
	// Listen is the SUB socket's address in bind mode
	// ("tcp://0.0.0.0:5557").
	Listen string `yaml:"listen"`
	// Topic is the subscription prefix in connect mode ("" takes all) and
	// the topic prefix events must carry in bind mode (default "kv@").
	Topic string `yaml:"topic"`
	// MaxMessageBytes caps one ZeroMQ message (all frames); a peer
	// sending more is disconnected before the message is read.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	MaxBlocksPerPod int `yaml:"max_blocks_per_pod"` // caps the blocks indexed per pod
	MaxConnections  int `yaml:"max_connections"`    // caps publishers connected at once in bind mode
	// StaleAfter marks a pod stale after that long without an event;
	// RebuildWindow is how long a pod stays stale after lost history.
	StaleAfter    time.Duration `yaml:"stale_after"`
	RebuildWindow time.Duration `yaml:"rebuild_window"`
	// ReplayTimeout bounds one replay request.
	ReplayTimeout time.Duration `yaml:"replay_timeout"`
	// Media are the block media indexed (default [GPU]).
	Media []string `yaml:"media"`
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	config.Default(&c.Mode, ModeConnect)
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.Mode == ModeBind && c.Topic == "" {
		c.Topic = DefaultTopicPrefix
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxBlocksPerPod == 0 {
		c.MaxBlocksPerPod = DefaultMaxBlocksPerPod
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.RebuildWindow == 0 {
		c.RebuildWindow = DefaultRebuildWindow
	}
	if c.ReplayTimeout == 0 {
		c.ReplayTimeout = DefaultReplayTimeout
	}
	if len(c.Media) == 0 {
		c.Media = []string{"GPU"}
	}
}

// Validate checks a defaulted config; errors name the key (relative to
// the block: the lead prefixes its path).
func (c *Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch c.Mode {
	case ModeConnect:
		if c.Listen != "" {
			add("listen: only used with mode: bind (mode is connect)")
		}
	case ModeBind:
		if c.Listen == "" {
			add("listen: required with mode: bind (e.g. tcp://0.0.0.0:5557)")
		} else if _, err := tcpAddr(c.Listen); err != nil {
			add("listen: %v", err)
		}
		if !strings.HasPrefix(c.Topic, DefaultTopicPrefix) {
			add("topic: %q: with mode: bind, topics are routed by kv@<pod-ip>:<port>@<model>, so the prefix must start with %q", c.Topic, DefaultTopicPrefix)
		}
	default:
		add("mode: %q: want connect or bind", c.Mode)
	}
	if c.Port < 1 || c.Port > 65535 {
		add("port: %d out of range 1-65535", c.Port)
	}
	if c.ReplayPort < 0 || c.ReplayPort > 65535 {
		add("replay_port: %d out of range 0-65535 (0: no replay)", c.ReplayPort)
	}
	if c.ReplayPort != 0 && c.ReplayPort == c.Port {
		add("replay_port: %d is the publisher port", c.ReplayPort)
	}
	if c.MaxMessageBytes < 1024 || c.MaxMessageBytes > 1<<30 {
		add("max_message_bytes: %d out of range 1024-1073741824", c.MaxMessageBytes)
	}
	if c.MaxBlocksPerPod < 1 || c.MaxBlocksPerPod > 1<<26 {
		add("max_blocks_per_pod: %d out of range 1-67108864", c.MaxBlocksPerPod)
	}
	if c.MaxConnections < 1 {
		add("max_connections: %d must be positive", c.MaxConnections)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"stale_after", c.StaleAfter}, {"rebuild_window", c.RebuildWindow}, {"replay_timeout", c.ReplayTimeout}} {
		if d.v < 0 {
			add("%s: %v must not be negative", d.key, d.v)
		}
	}
	for i, m := range c.Media {
		if m == "" {
			add("media[%d]: empty", i)
		}
	}
	return errors.Join(errs...)
}

// IndexOptions returns the index options c implies.
func (c *Config) IndexOptions() IndexOptions {
	return IndexOptions{
		MaxBlocksPerPod: c.MaxBlocksPerPod,
		StaleAfter:      c.StaleAfter,
		RebuildWindow:   c.RebuildWindow,
		Media:           c.Media,
	}
}

// tcpAddr checks a tcp://host:port endpoint and returns host:port.
func tcpAddr(ep string) (string, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("%q: want tcp://host:port", ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("%q: %w", ep, err)
	}
	if host == "*" {
		host = ""
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("%q: bad port %q", ep, port)
	}
	return net.JoinHostPort(host, port), nil
}

// Target is one pod the subscriber follows.
type Target struct {
	// Name identifies the pod in the index and in metrics.
	Name string
	// Address is the pod's host:port (its serving address); in bind mode
	// events whose topic is kv@<Address>@<model> are routed to this pod.
	Address string
	// Endpoint is the publisher to connect to (connect mode), and
	// ReplayEndpoint its replay socket ("" for none), as tcp://host:port.
	Endpoint       string
	ReplayEndpoint string
}

// TargetFor builds the target for a pod serving at address (host:port)
// with the given annotations: the publisher on the pod's host at Port,
// or at the port its AnnotationPort names; likewise for replay.
func (c *Config) TargetFor(name, address string, annotations map[string]string) (Target, error) {
	t := Target{Name: name, Address: address}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return t, fmt.Errorf("pod %s: address %q: %w", name, address, err)
	}
	port, replay := c.Port, c.ReplayPort
	for _, a := range []struct {
		key string
		dst *int
	}{{AnnotationPort, &port}, {AnnotationReplayPort, &replay}} {
		v, ok := annotations[a.key]
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > 65535 || (n == 0 && a.key == AnnotationPort) {
			return t, fmt.Errorf("pod %s: annotation %s: %q is not a port", name, a.key, v)
		}
		*a.dst = n
	}
	if c.Mode != ModeBind {
		t.Endpoint = "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
	}
	if replay > 0 {
		t.ReplayEndpoint = "tcp://" + net.JoinHostPort(host, strconv.Itoa(replay))
	}
	return t, nil
}
