package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/url"
	"os"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/tier2/admin"
)

// Status reports this replica for the admin API's /status: Redis as a
// PING made now finds it (bounded to a second), the limiter's view of
// Redis, and discovery's of Consul.
func (s *Server) Status(ctx context.Context) admin.Status {
	now := time.Now()
	st := admin.Status{Region: s.cfg.Region, ReplicaID: s.limiter.ReplicaID(), Version: s.version,
		StartedAt: s.started.UTC(), UptimeSeconds: now.Sub(s.started).Seconds()}

	st.Redis.Mode = "memory"
	if s.rdb != nil {
		st.Redis.Mode = "standalone"
		if _, ok := s.rdb.(*redis.ClusterClient); ok {
			st.Redis.Mode = "cluster"
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		start := time.Now()
		err := s.rdb.Ping(pctx).Err()
		cancel()
		ok := err == nil
		st.Redis.Reachable = &ok
		if ok {
			ms := float64(time.Since(start).Microseconds()) / 1000
			st.Redis.LatencyMS = &ms
		} else {
			st.Redis.Error = errorClass(err)
			if st.Redis.Error == "timeout" {
				// go-redis redials until the deadline, so a refused
				// connection reads as a timeout: one plain dial tells.
				st.Redis.Error = s.dialClass(ctx)
			}
		}
	}
	ls := s.limiter.Stats()
	st.Limiter = admin.LimiterStatus{RedisDown: ls.RedisDown, FailClosed: s.limiter.FailClosed(), Replicas: s.limiter.Replicas(),
		Admissions: ls.Admits, DegradedAdmissions: ls.Degraded, RedisErrors: ls.RedisErrors}

	ds := s.disc.Status()
	st.Consul = admin.ConsulStatus{Mode: "static", ClustersFound: ds.Clusters}
	if ds.Consul {
		ok := ds.Reachable
		st.Consul.Mode, st.Consul.Address, st.Consul.Reachable = "consul", ds.Address, &ok
		if !ds.LastSuccess.IsZero() {
			t := ds.LastSuccess.UTC()
			st.Consul.LastSuccessAt = &t
		}
		if ds.LastError != nil {
			t := ds.LastErrorAt.UTC()
			st.Consul.LastError, st.Consul.LastErrorAt = errorClass(ds.LastError), &t
		}
	}
	return st
}

// dialClass dials Redis's first address once: "timeout" when it
// connects (Redis accepted but did not answer) or the dial itself timed
// out, else why the dial failed.
func (s *Server) dialClass(ctx context.Context) string {
	if s.cfg.Redis == nil || len(s.cfg.Redis.Addresses) == 0 {
		return "timeout"
	}
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", s.cfg.Redis.Addresses[0])
	if err != nil {
		return errorClass(err)
	}
	conn.Close()
	return "timeout"
}

// errorClass says why a call to Redis or Consul failed without the
// socket addresses a raw error names (the log has those): a timeout, a
// refused or reset connection, or the server's own reply.
func errorClass(err error) string {
	var re redis.Error
	var ue *url.Error
	var ne net.Error
	switch {
	case errors.As(err, &re):
		return re.Error() // the server's reply, e.g. NOAUTH, LOADING
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		return "connection reset"
	case errors.As(err, &ue):
		return "request failed"
	case errors.As(err, new(*net.OpError)), errors.As(err, new(*net.DNSError)):
		return "unreachable"
	}
	return err.Error() // e.g. Consul's "Unexpected response code: 403 (ACL not found)"
}

// buildVersion is v, else the main module's version as Go recorded it.
func buildVersion(v string) string {
	if v != "" {
		return v
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// replicaID names this replica in Redis and in /status: the host name
// (a pod's name) and a random suffix, so a restarted pod's concurrency
// holdings are not mistaken for the new process's.
func replicaID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "tier2"
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}
