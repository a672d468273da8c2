package ratelimit

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/shared/config"
)

// RedisConfig describes how Tier 2 reaches Redis; the tenant store and
// the limiter share the client it builds. One address is a single node,
// several are a Redis Cluster (MasterName selects Sentinel instead).
type RedisConfig struct {
	Addrs      []string `yaml:"addrs"`
	MasterName string   `yaml:"master_name"`
	Username   string   `yaml:"username"`
	// Password, or PasswordFile (preferred: keeps the secret out of the
	// config file).
	Password     string         `yaml:"password"`
	PasswordFile string         `yaml:"password_file"`
	DB           int            `yaml:"db"`
	TLS          RedisTLSConfig `yaml:"tls"`
	// DialTimeout bounds connecting; default 1s. Request-path calls are
	// bounded separately by Options.Timeout.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	PoolSize    int           `yaml:"pool_size"`
}

// RedisTLSConfig turns on TLS to Redis.
type RedisTLSConfig struct {
	Enabled            bool   `yaml:"enabled"`
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"` // client certificate (mutual TLS)
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// Client builds a redis.UniversalClient from the configuration.
func (c RedisConfig) Client() (redis.UniversalClient, error) {
	if len(c.Addrs) == 0 {
		return nil, errors.New("redis: addrs: at least one address required")
	}
	pw := c.Password
	if c.PasswordFile != "" {
		b, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("redis: password_file: %w", err)
		}
		pw = strings.TrimRight(string(b), "\r\n")
	}
	o := &redis.UniversalOptions{
		Addrs: c.Addrs, MasterName: c.MasterName, Username: c.Username, Password: pw, DB: c.DB,
		DialTimeout: c.DialTimeout, PoolSize: c.PoolSize,
		// Deadlines from contexts reach the socket, so a slow Redis
		// cannot hold a request past the limiter's timeout.
		ContextTimeoutEnabled: true,
	}
	config.Default(&o.DialTimeout, time.Second)
	if c.TLS.Enabled {
		tc, err := c.TLS.config()
		if err != nil {
			return nil, err
		}
		o.TLSConfig = tc
	}
	if len(o.Addrs) > 1 && o.MasterName == "" {
		co := o.Cluster()
		// go-redis reloads the slot map on MOVED/READONLY replies but not
		// on connection errors; after a failover, calls would go to the
		// dead master until this periodic reload (default 60s). The
		// limiter also asks for a reload when a call fails.
		co.ClusterStateReloadInterval = ClusterStateReload
		return redis.NewClusterClient(co), nil
	}
	return redis.NewUniversalClient(o), nil
}

// ClusterStateReload is how often a Redis Cluster client built by
// RedisConfig.Client re-reads the slot map on its own.
const ClusterStateReload = 5 * time.Second

func (t RedisTLSConfig) config() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis: tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis: tls.ca_file %s: no certificates", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("redis: tls: cert_file and key_file go together")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis: tls client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
