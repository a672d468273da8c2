package integration

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/devstack"
)

// TestFailover kills Tier 1 processes under Tier 2: first the cluster Tier 2
// prefers (traffic moves to the other cluster of the region), then the rest
// of the region (traffic moves to the failover region). Every request in
// between must succeed: Tier 2 retries a connect error on the next cluster.
func TestFailover(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := s.client(s.apiKey)

	// requests sends n requests, alternating plain and streaming, and checks
	// each succeeds from one of the wanted clusters.
	requests := func(t *testing.T, n int, region string, clusters ...string) {
		t.Helper()
		for i := range n {
			var resp *http.Response
			if i%2 == 0 {
				c, err := client.Chat.Completions.New(ctx, chatParams(devstack.LlamaModel), option.WithResponseInto(&resp))
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if len(c.Choices) == 0 || c.Choices[0].Message.Content == "" {
					t.Fatalf("request %d: empty answer", i)
				}
			} else {
				p := chatParams(devstack.LlamaModel)
				p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
				stream := client.Chat.Completions.NewStreaming(ctx, p, option.WithResponseInto(&resp))
				var acc openai.ChatCompletionAccumulator
				for stream.Next() {
					acc.AddChunk(stream.Current())
				}
				if err := stream.Err(); err != nil {
					t.Fatalf("stream %d: %v", i, err)
				}
				if len(acc.Choices) == 0 || acc.Choices[0].Message.Content == "" || acc.Usage.TotalTokens == 0 {
					t.Fatalf("stream %d: choices %+v, usage %+v", i, acc.Choices, acc.Usage)
				}
			}
			gotRegion, gotCluster := resp.Header.Get("X-Infergate-Region"), resp.Header.Get("X-Infergate-Cluster")
			ok := gotRegion == region
			if len(clusters) > 0 {
				ok = ok && slices.Contains(clusters, gotCluster)
			}
			if !ok {
				t.Errorf("request %d served by %s/%s, want region %s clusters %v", i, gotRegion, gotCluster, region, clusters)
			}
		}
	}

	t.Run("cluster", func(t *testing.T) {
		s.tier1["cluster-a"].kill(t)
		// The pick's own region comes first in the failover order.
		requests(t, 8, devstack.HomeRegion, "cluster-b")
	})
	t.Run("region", func(t *testing.T) {
		s.tier1["cluster-b"].kill(t)
		requests(t, 8, devstack.FailoverRegion, "cluster-c", "cluster-d")
	})
}

// TestSharedServicesDown stops Consul and Redis under a running Tier 2:
// routing keeps Consul's last good answer, authentication answers from the
// tenant store's local cache, and the limiter fails open to its local share,
// so requests keep succeeding. Then Consul comes back empty (a dev-mode
// agent keeps no state, like a rebuilt one): the Tier 1s register again and
// Tier 2 follows. Then Redis comes back empty too: the tenant store seeds
// the configured tenant and key again.
func TestSharedServicesDown(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := s.client(s.apiKey)

	t.Run("down", func(t *testing.T) {
		s.consul.Stop()
		s.redis.Stop()
		for i := range 6 {
			var resp *http.Response
			c, err := client.Chat.Completions.New(ctx, chatParams(devstack.LlamaModel), option.WithResponseInto(&resp))
			if err != nil {
				t.Fatalf("request %d with Consul and Redis down: %v", i, err)
			}
			if len(c.Choices) == 0 || resp.Header.Get("X-Infergate-Cluster") == "" {
				t.Fatalf("request %d: %+v", i, c)
			}
		}
	})
	t.Run("consul restarted empty", func(t *testing.T) {
		s.consul.Start()
		// Each Tier 1 notices its registration is gone and registers again;
		// the new agent's indexes start over.
		s.waitServedBy(t, "cluster-a", 30*time.Second)
	})
	t.Run("redis restarted empty", func(t *testing.T) {
		// The tenant store sees the empty Redis (its change counter is
		// gone) and creates the tenants and keys seeded from tier2's
		// config again, so the configured key keeps working.
		s.redis.Start()
		// Nothing but the re-seed writes the tenant back into this Redis,
		// so seeing it proves Tier 2 noticed the empty Redis.
		rdb := redis.NewClient(&redis.Options{Addr: s.redis.Addr()})
		defer rdb.Close()
		waitFor(t, "tier2 to re-seed tenant acme", 30*time.Second, func() error {
			ok, err := rdb.HExists(ctx, "it:{tenants}:t", "acme").Result()
			if err == nil && !ok {
				err = errors.New("not in redis yet")
			}
			return err
		})
		s.waitServedBy(t, "cluster-a", 30*time.Second)
	})
}
