package tracing

import "strings"

// Attribute keys: the OpenTelemetry GenAI and HTTP semantic conventions
// where one fits, infergate.* for the router's own.
const (
	GenAIOperation    = "gen_ai.operation.name"
	GenAIModel        = "gen_ai.request.model"
	GenAISystem       = "gen_ai.system"
	GenAIInputTokens  = "gen_ai.usage.input_tokens"
	GenAIOutputTokens = "gen_ai.usage.output_tokens"
	HTTPMethod        = "http.request.method"
	HTTPRoute         = "http.route"
	HTTPStatus        = "http.response.status_code"
	ErrorType         = "error.type"

	Tenant   = "infergate.tenant"
	Stream   = "infergate.stream"
	Cluster  = "infergate.cluster"
	Region   = "infergate.region"
	Attempt  = "infergate.attempt"
	Pool     = "infergate.pool"
	Pod      = "infergate.pod"
	Outcome  = "infergate.outcome"
	TTFTMs   = "infergate.ttft_ms"
	QueuedMs = "infergate.queue.wait_ms"
)

// Operation is the gen_ai.operation.name of an API path (/v1/... or the
// part after /v1/), "" when none fits.
func Operation(path string) string {
	switch strings.TrimPrefix(path, "/v1/") {
	case "chat/completions", "responses", "messages":
		return "chat"
	case "completions":
		return "text_completion"
	case "embeddings":
		return "embeddings"
	}
	return ""
}
