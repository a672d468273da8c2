data "aws_secretsmanager_secret_version" "redis_auth" {
  secret_id = var.redis_auth_token_secret_arn
}

resource "aws_elasticache_subnet_group" "this" {
  name       = local.prefix
  subnet_ids = var.private_subnet_ids
  tags       = local.tags
}

# In-transit encryption with an AUTH token read from Secrets Manager (it is
# stored in the Terraform state: keep the state encrypted), at-rest
# encryption, Multi-AZ with automatic failover.
resource "aws_elasticache_replication_group" "this" {
  replication_group_id = local.short_prefix
  description          = "infergate Tier 2 shared state (${var.region})"
  engine               = "redis"
  engine_version       = var.redis_engine_version
  node_type            = var.redis_node_type
  port                 = local.redis_port
  parameter_group_name = var.redis_cluster_mode ? "default.redis7.cluster.on" : "default.redis7"
  subnet_group_name    = aws_elasticache_subnet_group.this.name
  security_group_ids   = [aws_security_group.redis.id]

  num_node_groups         = var.redis_cluster_mode ? var.redis_num_shards : null
  replicas_per_node_group = var.redis_cluster_mode ? var.redis_replicas_per_shard : null
  num_cache_clusters      = var.redis_cluster_mode ? null : 1 + var.redis_replicas_per_shard

  automatic_failover_enabled = var.redis_cluster_mode || var.redis_replicas_per_shard > 0
  multi_az_enabled           = var.redis_replicas_per_shard > 0

  transit_encryption_enabled = true
  at_rest_encryption_enabled = true
  kms_key_id                 = var.kms_key_arn
  auth_token                 = data.aws_secretsmanager_secret_version.redis_auth.secret_string

  snapshot_retention_limit   = var.redis_snapshot_retention_days
  auto_minor_version_upgrade = true
  apply_immediately          = false

  tags = local.tags
}
