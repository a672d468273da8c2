output "endpoint_dns" {
  description = "DNS name of the load balancer (point a Route 53 alias at it)."
  value       = aws_lb.this.dns_name
}

output "lb_zone_id" {
  description = "Hosted zone ID of the load balancer, for a Route 53 alias record."
  value       = aws_lb.this.zone_id
}

output "lb_arn" {
  description = "ARN of the network load balancer."
  value       = aws_lb.this.arn
}

output "api_url" {
  description = "Base URL of the OpenAI-compatible API (through the load balancer's DNS name; use your certificate's name in practice)."
  value       = "https://${aws_lb.this.dns_name}/v1"
}

output "admin_url" {
  description = "Base URL of the admin API."
  value       = "https://${aws_lb.this.dns_name}:${var.admin_listener_port}/admin/v1"
}

output "redis_endpoint" {
  description = "ElastiCache endpoint (host:port): the configuration endpoint in cluster mode, else the primary endpoint."
  value       = "${local.redis_host}:${local.redis_port}"
}

output "redis_replication_group_id" {
  description = "ElastiCache replication group ID."
  value       = aws_elasticache_replication_group.this.id
}

output "ecs_cluster_name" {
  description = "ECS cluster the service runs in."
  value       = local.cluster_name
}

output "service_name" {
  description = "ECS service name."
  value       = aws_ecs_service.this.name
}

output "task_definition_arn" {
  description = "ARN of the current task definition."
  value       = aws_ecs_task_definition.this.arn
}

output "log_group_name" {
  description = "CloudWatch log group of the tasks."
  value       = aws_cloudwatch_log_group.this.name
}

output "task_role_arn" {
  description = "IAM role the infergate container runs as."
  value       = aws_iam_role.task.arn
}

output "execution_role_arn" {
  description = "IAM role ECS uses to start the task (image pull, logs, secrets)."
  value       = aws_iam_role.execution.arn
}

output "task_security_group_id" {
  description = "Security group of the Tier 2 tasks (allow it into the Tier 1 load balancers and Consul)."
  value       = aws_security_group.tasks.id
}

output "config_yaml" {
  description = "The rendered Tier 2 configuration file."
  value       = local.config_yaml
}
