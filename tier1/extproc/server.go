package extproc

import (
	"context"
	"crypto/tls"
	"log/slog"
	"math"
	"net"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/infergate/infergate/tier1/gateway"
)

// Options configure a Server. Zero fields take defaults.
type Options struct {
	Logger *slog.Logger // default slog.Default()
	// AuthByEnvoy says Envoy authenticates clients (ext_authz, jwt_authn,
	// ...), so the server skips the gateway's bearer-token check and trusts
	// no client with X-Infergate-Priority. When false (the default), the
	// request's Authorization header is checked against the gateway's
	// tokens exactly as on the HTTP listener, so auth stays on by default
	// whichever way requests arrive.
	AuthByEnvoy bool
	// EndpointList puts the fallbacks in the destination header and
	// metadata value itself ("ip:port,ip:port,...", GIE protocol v0.4+),
	// for data planes that walk such a list. Off by default: an
	// ORIGINAL_DST cluster reading the header needs a single ip:port, so
	// the fallbacks go under KeyFallback in the metadata instead.
	EndpointList bool
	// TLS, when set, serves gRPC over TLS with this configuration (Tier
	// 1's ext_proc_tls; its ClientCAs ask Envoy for a client
	// certificate). nil: plaintext, for a data plane on loopback or in
	// the pod.
	TLS *tls.Config
}

// Server is the ext_proc server. Create it with New.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	gw   *gateway.Gateway
	log  *slog.Logger
	opts Options
}

// New returns a server routing with gw.
func New(gw *gateway.Gateway, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Server{gw: gw, log: opts.Logger, opts: opts}
}

// Register adds the ext_proc service and the gRPC health service (which
// GIE's protocol asks an endpoint picker to serve) to gs, which should be
// built with ServerOptions.
func (s *Server) Register(gs *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(gs, s)
	hs := health.NewServer()
	hs.SetServingStatus(extprocv3.ExternalProcessor_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
}

// ServerOptions are the gRPC server options ext_proc needs: a BUFFERED
// body arrives as one message, so the receive limit (gRPC's default is
// 4 MiB) must hold max_body_bytes plus the headers. It is sized from the
// configuration at the time of the call; a larger max_body_bytes loaded
// later needs a restart to take effect here.
func (s *Server) ServerOptions() []grpc.ServerOption {
	const headroom = 1 << 20 // headers and protobuf framing
	limit := s.gw.MaxBodyBytes() + headroom
	if limit > math.MaxInt32 {
		limit = math.MaxInt32
	}
	t := s.gw.Timeouts()
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(limit)),
		// The listener's timeouts, as the HTTP listener's: a connection
		// must finish its TLS and HTTP/2 handshakes within read_header,
		// and one without streams is closed after client_idle.
		grpc.ConnectionTimeout(t.ReadHeader),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: t.ClientIdle}),
	}
	if s.opts.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.opts.TLS)))
	}
	return opts
}

// Serve serves ext_proc on ln until ctx is done, then stops gracefully,
// giving open streams up to grace before they are cut.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	gs := grpc.NewServer(s.ServerOptions()...)
	s.Register(gs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-stopped:
		case <-t.C:
			gs.Stop()
		}
	}()
	err := gs.Serve(ln)
	if ctx.Err() != nil {
		<-done
		return nil
	}
	return err
}
