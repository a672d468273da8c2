# infergate Tier 2, the regional front door, on ECS Fargate behind a TLS
# network load balancer, with ElastiCache Redis for the state its replicas
# share (tenants, API keys, rate-limit counters). With var.tls Tier 2 also
# serves TLS itself (the load balancer re-encrypts, or passes TCP through
# with var.lb_tls_passthrough); with var.tier1_tls it dials Tier 1 with
# mutual TLS.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  prefix       = "${var.name}-tier2-${var.region}"
  short_prefix = substr("${var.name}-t2-${replace(var.region, "-", "")}", 0, 28)
  tags = merge(var.tags, {
    "app.kubernetes.io/part-of" = "infergate"
    "infergate/component"       = "tier2"
  })

  cluster_name = var.create_ecs_cluster ? aws_ecs_cluster.this[0].name : var.ecs_cluster_name
  cluster_arn  = var.create_ecs_cluster ? aws_ecs_cluster.this[0].arn : "arn:${data.aws_partition.current.partition}:ecs:${var.region}:${data.aws_caller_identity.current.account_id}:cluster/${var.ecs_cluster_name}"

  redis_host = var.redis_cluster_mode ? aws_elasticache_replication_group.this.configuration_endpoint_address : aws_elasticache_replication_group.this.primary_endpoint_address
  redis_port = 6379

  # The Tier 2 configuration file (docs/tier2.md). Secrets are not in it:
  # they reach the container as environment variables from Secrets Manager
  # (the *_env keys name them). A Redis cluster client needs more than one
  # seed address, so in cluster mode the configuration endpoint is listed
  # twice.
  base_config = merge(
    {
      listen = ":${var.container_port}"
      region = var.region
      consul = merge(
        { address = var.consul_address },
        var.consul_token_secret_arn == null ? {} : { token_env = "CONSUL_HTTP_TOKEN" },
      )
      clusters = [for c in var.tier1_endpoints : merge(
        { name = c.name, address = c.address, region = coalesce(c.region, var.region) },
        length(c.models) == 0 ? {} : { models = c.models },
        c.cost == null ? {} : { cost = c.cost, cost_unit = c.cost_unit },
        c.capacity == null ? {} : { capacity = c.capacity },
      )]
      tier1 = merge(
        var.tier1_token_secret_arn == null ? {} : { token_env = "INFERGATE_TIER1_TOKEN" },
        var.tier1_tls == null ? {} : { tls = local.tier1_tls },
      )
      redis = {
        addresses    = var.redis_cluster_mode ? ["${local.redis_host}:${local.redis_port}", "${local.redis_host}:${local.redis_port}"] : ["${local.redis_host}:${local.redis_port}"]
        tls          = true
        password_env = "INFERGATE_REDIS_PASSWORD"
      }
      limits = {
        replicas = var.min_capacity
      }
      admin = merge(
        {
          listen    = ":${var.admin_port}"
          token_env = "INFERGATE_ADMIN_TOKEN"
        },
        local.tls_admin ? { tls = local.server_tls } : {},
      )
      metrics = merge(
        { listen = length(var.metrics_scrape_cidrs) > 0 ? ":${var.metrics_port}" : "127.0.0.1:${var.metrics_port}" },
        local.tls_metrics ? { tls = local.server_tls } : {},
      )
    },
    var.tls == null ? {} : { tls = local.server_tls },
  )
  config_yaml = yamlencode(merge(local.base_config, var.tier2_config))

  # TLS files: PEM text from Secrets Manager or SSM, which the config
  # container writes under tls_dir before infergate starts (ECS can inject
  # secrets only as environment variables, infergate reads files).
  tls_dir     = "/etc/infergate/tls"
  tls_admin   = var.tls == null ? false : var.tls.admin
  tls_metrics = var.tls == null ? false : var.tls.metrics
  server_tls = var.tls == null ? {} : merge(
    {
      cert_file   = "${local.tls_dir}/tls.crt"
      key_file    = "${local.tls_dir}/tls.key"
      min_version = var.tls.min_version
    },
    var.tls.client_ca_arn == null ? {} : { client_ca_file = "${local.tls_dir}/ca.crt" },
    var.tls.client_auth == null ? {} : { client_auth = var.tls.client_auth },
  )
  tier1_tls = var.tier1_tls == null ? {} : merge(
    var.tier1_tls.ca_arn == null ? {} : { ca_file = "${local.tls_dir}/tier1/ca.crt" },
    var.tier1_tls.certificate_arn == null ? {} : {
      cert_file = "${local.tls_dir}/tier1/tls.crt"
      key_file  = "${local.tls_dir}/tier1/tls.key"
    },
    var.tier1_tls.server_name == null ? {} : { server_name = var.tier1_tls.server_name },
    var.tier1_tls.min_version == null ? {} : { min_version = var.tier1_tls.min_version },
  )
  tls_files = [for f in [
    { env = "INFERGATE_TLS_CERT", file = "tls.crt", arn = var.tls == null ? null : var.tls.certificate_arn },
    { env = "INFERGATE_TLS_KEY", file = "tls.key", arn = var.tls == null ? null : var.tls.private_key_arn },
    { env = "INFERGATE_TLS_CLIENT_CA", file = "ca.crt", arn = var.tls == null ? null : var.tls.client_ca_arn },
    { env = "INFERGATE_TIER1_CA", file = "tier1/ca.crt", arn = var.tier1_tls == null ? null : var.tier1_tls.ca_arn },
    { env = "INFERGATE_TIER1_CERT", file = "tier1/tls.crt", arn = var.tier1_tls == null ? null : var.tier1_tls.certificate_arn },
    { env = "INFERGATE_TIER1_KEY", file = "tier1/tls.key", arn = var.tier1_tls == null ? null : var.tier1_tls.private_key_arn },
  ] : f if f.arn != null]
  tls_file_arns = [for f in local.tls_files : f.arn]

  secret_arns = concat(
    compact([
      var.admin_token_secret_arn,
      var.redis_auth_token_secret_arn,
      var.consul_token_secret_arn,
      var.tier1_token_secret_arn,
    ]),
    [for a in local.tls_file_arns : a if length(regexall("^arn:[^:]+:ssm:", a)) == 0],
  )
  ssm_parameter_arns = [for a in local.tls_file_arns : a if length(regexall("^arn:[^:]+:ssm:", a)) > 0]

  # How the load balancer handles TLS (see var.tls, var.lb_tls_passthrough):
  # terminate with ACM (plain TCP or re-encrypted TLS to the task), or pass
  # TCP through to Tier 2's own TLS. Health checks follow the API
  # listener; with client certificates required there, an HTTP check
  # cannot complete a handshake, so it is a TCP check.
  lb_listener_protocol = var.lb_tls_passthrough ? "TCP" : "TLS"
  api_target_protocol  = var.tls == null || var.lb_tls_passthrough ? "TCP" : "TLS"
  adm_target_protocol  = local.tls_admin && !var.lb_tls_passthrough ? "TLS" : "TCP"
  health_check_protocol = var.tls == null ? "HTTP" : (
    var.tls.client_auth == "require" ? "TCP" : "HTTPS"
  )
}

resource "aws_ecs_cluster" "this" {
  count = var.create_ecs_cluster ? 1 : 0
  name  = local.prefix

  setting {
    name  = "containerInsights"
    value = "enabled"
  }

  tags = local.tags
}

resource "aws_cloudwatch_log_group" "this" {
  name              = "/ecs/${local.prefix}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = local.tags
}
