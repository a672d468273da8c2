// Package extproc runs Tier 1's endpoint picker behind Envoy: an Envoy
// external-processing server (envoy.service.ext_proc.v3.ExternalProcessor)
// that behaves like the Gateway API Inference Extension's endpoint picker
// (EPP). Envoy sends each request's headers and buffered body; the server
// parses and schedules it with the gateway's own code (tier1/gateway Pick:
// the same parser, model resolution, queue, scheduler and tracker as the
// HTTP proxy) and answers with the chosen pod in the
// x-gateway-destination-endpoint header and in dynamic metadata under
// envoy.lb, which Envoy's ORIGINAL_DST cluster (or another GIE-aware load
// balancer) then connects to. Envoy proxies the bytes; this server watches
// the response go by to keep the tracker's in-flight counts and TTFT right.
package extproc

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier1/gateway"
)

// Names of the GIE endpoint picker protocol.
const (
	// HeaderDestination carries the picked endpoint (ip:port) to Envoy.
	HeaderDestination = "x-gateway-destination-endpoint"
	// MetadataNamespace is the dynamic metadata namespace of the pick.
	MetadataNamespace = "envoy.lb"
	// KeyDestination is the pick's key in MetadataNamespace (same value as
	// the header, as the protocol requires).
	KeyDestination = HeaderDestination
	// KeyFallback lists the fallback endpoints, comma-separated, best
	// first (GIE protocol v0.3's key; see Options.EndpointList for v0.4+).
	KeyFallback = "x-gateway-destination-endpoint-fallback"
	// KeyServed is where Envoy reports, in the response's metadata
	// context, the endpoint that actually served the request.
	KeyServed = "x-gateway-destination-endpoint-served"
)

// exchange is the state of one HTTP request's ext_proc stream.
type exchange struct {
	s          *Server
	stream     extprocv3.ExternalProcessor_ProcessServer
	fullDuplex bool // request body in FULL_DUPLEX_STREAMED mode
	respDuplex bool // response body in FULL_DUPLEX_STREAMED mode
	path       string
	method     string
	header     http.Header
	body       []byte
	pick       *gateway.Pick
	complete   bool // the response reached its end
}

// Process handles one HTTP request: Envoy opens a stream per request and
// sends its phases in order (request headers, body, trailers, response
// headers, body, trailers), each waiting for this server's answer.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &exchange{s: s, stream: stream}
	defer func() {
		// A stream that ends before the response did (the client went
		// away, Envoy reset) must still take the request off its pod's
		// in-flight count.
		if x.pick != nil {
			x.pick.Done(x.complete)
		}
	}()
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return fmt.Errorf("ext_proc receive: %w", err)
		}
		if pc := req.GetProtocolConfig(); pc != nil {
			x.fullDuplex = pc.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
			x.respDuplex = pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		stop, err := x.handle(req)
		if err != nil {
			return status.Errorf(codes.Unknown, "ext_proc: %v", err)
		}
		if stop {
			return nil
		}
	}
}

// handle answers one message; stop ends the stream (after an immediate
// response Envoy expects nothing more).
func (x *exchange) handle(req *extprocv3.ProcessingRequest) (stop bool, err error) {
	switch v := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		x.header, x.path, x.method = convertHeaders(v.RequestHeaders.GetHeaders())
		if v.RequestHeaders.GetEndOfStream() {
			// No body will come: decide now (an inference request without
			// a body is refused by the same parser as on the HTTP path).
			return x.decide(true)
		}
		if x.fullDuplex {
			// The headers answer must carry the pick: it waits for the
			// body, as GIE's picker does in this mode.
			return false, nil
		}
		return false, x.send(&extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}},
			// Ask for the whole body before the pick; honoured only if the
			// filter sets allow_mode_override (the Envoy config should
			// already say BUFFERED, see docs/tier1-extproc.md).
			ModeOverride: &filterv3.ProcessingMode{
				RequestBodyMode:    filterv3.ProcessingMode_BUFFERED,
				ResponseHeaderMode: filterv3.ProcessingMode_SEND,
				ResponseBodyMode:   filterv3.ProcessingMode_STREAMED,
			},
		})
	case *extprocv3.ProcessingRequest_RequestBody:
		chunk := v.RequestBody.GetBody()
		if limit := x.s.gw.MaxBodyBytes(); int64(len(x.body))+int64(len(chunk)) > limit {
			return true, x.refuse(&gateway.PickError{Status: http.StatusRequestEntityTooLarge, Code: "request_too_large",
				Message: fmt.Sprintf("request body exceeds %d bytes", limit)})
		}
		x.body = append(x.body, chunk...)
		if !v.RequestBody.GetEndOfStream() {
			return false, nil // BUFFERED sends one message; keep collecting otherwise
		}
		return x.decide(false)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if x.pick == nil && x.fullDuplex {
			// The body ended without end_of_stream; trailers end it.
			if stop, err := x.decide(false); stop || err != nil {
				return stop, err
			}
		}
		return false, x.send(&extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}},
		})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return false, x.responseHeaders(req, v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, x.responseBody(v.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.finish()
		return false, x.send(&extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}},
		})
	}
	return false, fmt.Errorf("unexpected message %T", req.Request)
}

// decide picks the pod for the request read so far and answers Envoy: an
// immediate error response, or the headers/body answer carrying the pick.
// atHeaders is set when the request had no body.
func (x *exchange) decide(atHeaders bool) (stop bool, err error) {
	pick, err := x.s.gw.Pick(x.stream.Context(), gateway.PickRequest{
		Path:     x.path,
		Method:   x.method,
		Header:   x.header,
		Body:     x.body,
		AuthDone: x.s.opts.AuthByEnvoy,
	})
	if err != nil {
		var pe *gateway.PickError
		if !errors.As(err, &pe) {
			pe = &gateway.PickError{Status: http.StatusInternalServerError, Code: "internal_error", Message: err.Error()}
		}
		if x.stream.Context().Err() != nil {
			return true, nil // Envoy gave up on the request; nobody to answer
		}
		x.s.log.Debug("ext_proc request refused", "path", x.path, "status", pe.Status, "code", pe.Code, "err", pe.Message)
		return true, x.refuse(pe)
	}
	x.pick = pick
	x.s.log.Debug("ext_proc pick", "model", pick.Model, "pool", pick.Pool, "pod", pick.Pod, "endpoint", pick.Address, "fallbacks", pick.Fallbacks)
	common := &extprocv3.CommonResponse{
		HeaderMutation: x.requestMutation(pick),
		// The destination header may select the route (and its cluster):
		// make Envoy re-evaluate it with the header set.
		ClearRouteCache: true,
	}
	meta := x.metadata(pick)
	switch {
	case atHeaders:
		return false, x.send(&extprocv3.ProcessingResponse{
			Response:        &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}},
			DynamicMetadata: meta,
		})
	case x.fullDuplex:
		// Full duplex: the held-back headers answer carries the pick, then
		// the body goes back unchanged as the streamed body answer.
		if err := x.send(&extprocv3.ProcessingResponse{
			Response:        &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}},
			DynamicMetadata: meta,
		}); err != nil {
			return false, err
		}
		return false, x.send(&extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
				BodyMutation: streamed(x.body, true),
			}}},
		})
	default:
		// BUFFERED: headers have not left Envoy yet, so the body answer
		// may still change them.
		return false, x.send(&extprocv3.ProcessingResponse{
			Response:        &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}},
			DynamicMetadata: meta,
		})
	}
}

// destination is the destination value: the pick, or with EndpointList the
// pick followed by its fallbacks.
func (x *exchange) destination(p *gateway.Pick) string {
	if x.s.opts.EndpointList && len(p.Fallbacks) > 0 {
		return p.Address + "," + strings.Join(p.Fallbacks, ",")
	}
	return p.Address
}

// requestMutation sets the destination (overwriting whatever the client
// sent under that name) and strips what the HTTP proxy strips before a
// request reaches a pod: internal routing headers and client credentials.
func (x *exchange) requestMutation(p *gateway.Pick) *extprocv3.HeaderMutation {
	m := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(HeaderDestination, x.destination(p))}}
	if x.header.Get(requestIDHeader) != p.RequestID {
		// The client's was malformed or absent: the pod gets the ID the
		// gateway logs under, as on the HTTP listener.
		m.SetHeaders = append(m.SetHeaders, setHeader(requestIDHeader, p.RequestID))
	}
	for k := range x.header {
		lk := strings.ToLower(k)
		if lk == HeaderDestination {
			continue // overwritten above; removing it too could drop ours
		}
		if gateway.IsInternalHeader(lk) || lk == "cookie" ||
			(lk == "authorization" && p.UpstreamToken == "") {
			m.RemoveHeaders = append(m.RemoveHeaders, lk)
		}
	}
	if p.UpstreamToken != "" {
		m.SetHeaders = append(m.SetHeaders, setHeader("authorization", "Bearer "+p.UpstreamToken))
	}
	return m
}

// metadata is the envoy.lb dynamic metadata carrying the pick.
func (x *exchange) metadata(p *gateway.Pick) *structpb.Struct {
	fields := map[string]*structpb.Value{KeyDestination: structpb.NewStringValue(x.destination(p))}
	if !x.s.opts.EndpointList && len(p.Fallbacks) > 0 {
		fields[KeyFallback] = structpb.NewStringValue(strings.Join(p.Fallbacks, ","))
	}
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: fields}),
	}}
}

func (x *exchange) responseHeaders(req *extprocv3.ProcessingRequest, rh *extprocv3.HttpHeaders) error {
	h, _, _ := convertHeaders(rh.GetHeaders())
	m := &extprocv3.HeaderMutation{}
	if x.pick != nil {
		if served := servedEndpoint(req); served != "" {
			x.pick.Served(served)
		}
		code, _ := strconv.Atoi(h.Get(":status"))
		x.pick.Response(code, h, rh.GetEndOfStream())
		// A pod must not be able to spoof the router's headers.
		for k := range h {
			lk := strings.ToLower(k)
			if gateway.IsInternalHeader(lk) && lk != strings.ToLower(x.pick.PodHeader) {
				m.RemoveHeaders = append(m.RemoveHeaders, lk)
			}
		}
		if x.pick.PodHeader != "" {
			m.SetHeaders = append(m.SetHeaders, setHeader(strings.ToLower(x.pick.PodHeader), x.pick.ServedPod()))
		}
		// The answer carries the request's ID, as on the HTTP listener
		// (the pod's own, if any, is not ours).
		m.SetHeaders = append(m.SetHeaders, setHeader(requestIDHeader, x.pick.RequestID))
	}
	if rh.GetEndOfStream() {
		x.finish()
	}
	return x.send(&extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: m},
		}},
	})
}

func (x *exchange) responseBody(b *extprocv3.HttpBody) error {
	if x.pick != nil {
		x.pick.Body(b.GetBody())
	}
	eos := b.GetEndOfStream()
	if eos {
		x.finish()
	}
	common := &extprocv3.CommonResponse{}
	if x.respDuplex {
		// Full duplex: Envoy forwards only what comes back.
		common.BodyMutation = streamed(b.GetBody(), eos)
	}
	return x.send(&extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: common}},
	})
}

// finish ends the request's accounting once its response is complete.
func (x *exchange) finish() {
	x.complete = true
	if x.pick != nil {
		x.pick.Done(true)
	}
}

// refuse answers the client directly with a JSON error in the shape of
// the request's API (OpenAI's, or Anthropic's on /v1/messages).
func (x *exchange) refuse(pe *gateway.PickError) error {
	path, _, _ := strings.Cut(x.path, "?")
	body := openai.ErrorBody(openai.APIForPath(path), pe.Status, openai.TypeForStatus(pe.Status), pe.Code, pe.Message)
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}}
	if pe.RetryAfter > 0 {
		hm.SetHeaders = append(hm.SetHeaders, setHeader("retry-after", strconv.Itoa(int(pe.RetryAfter.Round(time.Second)/time.Second))))
	}
	if pe.Status == http.StatusUnauthorized {
		hm.SetHeaders = append(hm.SetHeaders, setHeader("www-authenticate", `Bearer realm="infergate"`))
	}
	return x.send(&extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(pe.Status)},
			Headers: hm,
			Body:    body,
			Details: "infergate_" + pe.Code,
		}},
	})
}

func (x *exchange) send(resp *extprocv3.ProcessingResponse) error {
	if err := x.stream.Send(resp); err != nil {
		return fmt.Errorf("ext_proc send: %w", err)
	}
	return nil
}

// requestIDHeader is X-Request-Id as Envoy names headers.
var requestIDHeader = strings.ToLower(cluster.HeaderRequestID)

func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

func streamed(body []byte, eos bool) *extprocv3.BodyMutation {
	return &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos},
	}}
}

// convertHeaders turns Envoy's header map into an http.Header (pseudo
// headers kept under their own names) and returns the path and method.
// Envoy sends values in raw_value; value is read for older versions.
func convertHeaders(hm *corev3.HeaderMap) (h http.Header, path, method string) {
	h = http.Header{}
	for _, hv := range hm.GetHeaders() {
		v := hv.GetValue()
		if len(hv.GetRawValue()) > 0 {
			v = string(hv.GetRawValue())
		}
		switch hv.GetKey() {
		case ":path":
			path = v
		case ":method":
			method = v
		}
		if strings.HasPrefix(hv.GetKey(), ":") {
			h[hv.GetKey()] = append(h[hv.GetKey()], v)
			continue
		}
		h.Add(hv.GetKey(), v)
	}
	return h, path, method
}

// servedEndpoint is the endpoint Envoy reports as having served the
// request (GIE protocol: envoy.lb / x-gateway-destination-endpoint-served).
func servedEndpoint(req *extprocv3.ProcessingRequest) string {
	ns := req.GetMetadataContext().GetFilterMetadata()[MetadataNamespace]
	return ns.GetFields()[KeyServed].GetStringValue()
}
