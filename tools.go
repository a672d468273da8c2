//go:build tools

package tools

import (
	_ "github.com/cespare/xxhash/v2"
	_ "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	_ "github.com/golang-jwt/jwt/v5"
	_ "github.com/hashicorp/consul/api"
	_ "github.com/hashicorp/hcl/v2/hclparse"
	_ "github.com/labstack/echo/v4"
	_ "github.com/openai/openai-go/v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/sony/gobreaker/v2"
	_ "golang.org/x/time/rate"
	_ "google.golang.org/grpc"
	_ "gopkg.in/yaml.v3"
)
