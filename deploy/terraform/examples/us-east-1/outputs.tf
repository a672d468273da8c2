output "endpoint_dns" {
  description = "Point api.<your domain> (us-east-1) at this name."
  value       = module.tier2.endpoint_dns
}

output "admin_url" {
  description = "Admin API base URL."
  value       = module.tier2.admin_url
}

output "redis_endpoint" {
  description = "ElastiCache configuration endpoint."
  value       = module.tier2.redis_endpoint
}

output "service_name" {
  description = "ECS service name."
  value       = module.tier2.service_name
}
