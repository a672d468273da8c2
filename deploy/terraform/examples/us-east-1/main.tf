# Tier 2 for us-east-1: Redis in cluster mode, two EKS clusters' Tier 1
# routers listed statically in addition to Consul discovery.
module "tier2" {
  source = "../../modules/tier2-region"

  name   = "infergate"
  region = "us-east-1"
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

  tier1_endpoints = [
    {
      name     = "use1-h100-a"
      address  = "https://tier1.use1-h100-a.internal.example.com"
      models   = ["meta-llama/Llama-3.1-70B-Instruct"]
      cost     = 12.3
      capacity = 512
    },
    {
      name     = "use1-a10g-b"
      address  = "https://tier1.use1-a10g-b.internal.example.com"
      models   = ["meta-llama/Llama-3.1-8B-Instruct"]
      cost     = 1.2
      capacity = 256
    },
  ]

  # Tier 2's own TLS behind the load balancer (re-encrypted; clients still
  # see certificate_arn) and mutual TLS to the Tier 1 routers, from PEM text
  # in Secrets Manager or SSM (docs/deploy-aws.md, "TLS to the tasks and mutual TLS to Tier 1"):
  # tls = {
  #   certificate_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/tier2-cert-AbCdEf"
  #   private_key_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/tier2-key-AbCdEf"
  # }
  # tier1_tls = {
  #   ca_arn          = "arn:aws:ssm:us-east-1:123456789012:parameter/infergate/tier1-ca"
  #   certificate_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/tier2-client-cert-AbCdEf"
  #   private_key_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:infergate/tier2-client-key-AbCdEf"
  # }

  tier2_config = {
    region_order = ["us-west-2"]
    routing = {
      default_policy = "cost-first"
    }
  }

  redis_cluster_mode       = true
  redis_num_shards         = 2
  redis_replicas_per_shard = 1

  task_cpu      = 2048
  task_memory   = 4096
  desired_count = 3
  min_capacity  = 3
  max_capacity  = 20
}
