# Tier 2 for eu-west-1: a smaller region, Redis without cluster mode, Tier 1
# routers found through Consul only, EU tenants pinned to the region.
module "tier2" {
  source = "../../modules/tier2-region"

  name   = "infergate"
  region = "eu-west-1"
  image  = var.image

  vpc_id             = var.vpc_id
  public_subnet_ids  = var.public_subnet_ids
  private_subnet_ids = var.private_subnet_ids
  certificate_arn    = var.certificate_arn
  admin_cidr_blocks  = var.admin_cidr_blocks

  admin_token_secret_arn      = var.admin_token_secret_arn
  redis_auth_token_secret_arn = var.redis_auth_token_secret_arn
  consul_address              = var.consul_address
  consul_token_secret_arn     = var.consul_token_secret_arn
  tier1_token_secret_arn      = var.tier1_token_secret_arn

  tier2_config = {
    routing = {
      default_policy = "region-pinned"
    }
  }

  redis_cluster_mode       = false
  redis_replicas_per_shard = 1
  redis_node_type          = "cache.r7g.large"

  desired_count = 2
  min_capacity  = 2
  max_capacity  = 8
}
