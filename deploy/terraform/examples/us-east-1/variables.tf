variable "environment" {
  description = "Environment name, used in tags."
  type        = string
  default     = "production"
}

variable "image" {
  description = "infergate container image."
  type        = string
  default     = "ghcr.io/infergate/infergate:0.1.0"
}

variable "vpc_id" {
  description = "VPC for Tier 2 in us-east-1."
  type        = string
}

variable "public_subnet_ids" {
  description = "Public subnets for the load balancer."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Private subnets for the tasks and ElastiCache."
  type        = list(string)
}

variable "certificate_arn" {
  description = "ACM certificate (in us-east-1) for the API hostname."
  type        = string
}

variable "admin_token_secret_arn" {
  description = "Secrets Manager secret with the admin API token."
  type        = string
}

variable "redis_auth_token_secret_arn" {
  description = "Secrets Manager secret with the ElastiCache AUTH token."
  type        = string
}

variable "consul_address" {
  description = "Consul address where the Tier 1 routers register."
  type        = string
}

variable "consul_token_secret_arn" {
  description = "Secrets Manager secret with the Consul ACL token."
  type        = string
  default     = null
}

variable "tier1_token_secret_arn" {
  description = "Secrets Manager secret with the Tier 1 bearer token."
  type        = string
  default     = null
}

variable "admin_cidr_blocks" {
  description = "Operator networks allowed to reach the admin API."
  type        = list(string)
  default     = []
}
