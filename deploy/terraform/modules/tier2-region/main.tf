# infergate Tier 2, the regional front door, on ECS Fargate behind a TLS
# network load balancer, with ElastiCache Redis for the state its replicas
# share (tenants, API keys, rate-limit counters).

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
  base_config = {
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
    tier1 = var.tier1_token_secret_arn == null ? {} : { token_env = "INFERGATE_TIER1_TOKEN" }
    redis = {
      addresses    = var.redis_cluster_mode ? ["${local.redis_host}:${local.redis_port}", "${local.redis_host}:${local.redis_port}"] : ["${local.redis_host}:${local.redis_port}"]
      tls          = true
      password_env = "INFERGATE_REDIS_PASSWORD"
    }
    limits = {
      replicas = var.min_capacity
    }
    admin = {
      listen    = ":${var.admin_port}"
      token_env = "INFERGATE_ADMIN_TOKEN"
    }
    metrics = {
      listen = length(var.metrics_scrape_cidrs) > 0 ? ":${var.metrics_port}" : "127.0.0.1:${var.metrics_port}"
    }
  }
  config_yaml = yamlencode(merge(local.base_config, var.tier2_config))

  secret_arns = compact([
    var.admin_token_secret_arn,
    var.redis_auth_token_secret_arn,
    var.consul_token_secret_arn,
    var.tier1_token_secret_arn,
  ])
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
