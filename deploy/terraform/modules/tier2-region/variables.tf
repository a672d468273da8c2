# ---------------------------------------------------------------------------
# Required
# ---------------------------------------------------------------------------

variable "name" {
  description = "Name prefix for every resource, e.g. \"infergate\". The region is appended where names must be unique."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,20}$", var.name))
    error_message = "The name must be 2-21 characters of lower-case letters, digits and hyphens, starting with a letter."
  }
}

variable "region" {
  description = "AWS region this Tier 2 serves (used in its configuration and for CloudWatch logs); must match the provider's region."
  type        = string
}

variable "vpc_id" {
  description = "VPC for the load balancer, the ECS tasks and ElastiCache."
  type        = string
}

variable "public_subnet_ids" {
  description = "Subnets for the load balancer (public subnets for an internet-facing NLB, private ones when internal = true)."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Private subnets for the ECS tasks and ElastiCache (at least two availability zones)."
  type        = list(string)
}

variable "image" {
  description = "infergate container image, e.g. ghcr.io/infergate/infergate:0.1.0."
  type        = string
}

variable "certificate_arn" {
  description = "ACM certificate ARN for the load balancer's TLS listeners (the certificate clients see). Unused when lb_tls_passthrough is true: Tier 2's own certificate (var.tls) then faces the clients."
  type        = string
}

variable "admin_token_secret_arn" {
  description = "Secrets Manager secret ARN holding the admin API bearer token (a plain string)."
  type        = string
}

variable "redis_auth_token_secret_arn" {
  description = "Secrets Manager secret ARN holding the ElastiCache AUTH token (a plain string, 16-128 printable characters, no @, \" or /)."
  type        = string
}

variable "consul_address" {
  description = "Consul HTTP(S) address where the Tier 1 routers register, e.g. https://consul.example.internal:8501."
  type        = string
}

# ---------------------------------------------------------------------------
# Optional
# ---------------------------------------------------------------------------

variable "consul_token_secret_arn" {
  description = "Secrets Manager secret ARN holding the Consul ACL token (read access to the infergate-tier1 service). Null: no token."
  type        = string
  default     = null
}

variable "tier1_token_secret_arn" {
  description = "Secrets Manager secret ARN holding the bearer token Tier 2 presents to the Tier 1 routers. Null: none."
  type        = string
  default     = null
}

variable "tls" {
  description = <<-EOT
    Tier 2's own TLS (config keys tls, and admin.tls / metrics.tls when admin / metrics are true). Null (default): the load balancer terminates TLS with certificate_arn and forwards plain TCP inside the VPC.
    Set, the load balancer re-encrypts: clients still see the ACM certificate (ACM renews it), and the hop from the load balancer to the task is TLS to this certificate (an NLB does not verify it, so a private CA will do). With lb_tls_passthrough the load balancer forwards TCP untouched and Tier 2 terminates TLS itself; that is the only way to ask clients for certificates (client_auth), since an NLB cannot.
    certificate_arn, private_key_arn and client_ca_arn are ARNs of Secrets Manager secrets or SSM SecureString parameters holding PEM text (chain leaf first; the key unencrypted). ECS hands them to the task's config container, which writes them to /etc/infergate/tls (owner 65532, mode 0600) before infergate starts; the execution role may read exactly these ARNs.
    Rotation: update the secret, then start new tasks (aws ecs update-service --force-new-deployment); a running task keeps the files it started with.
    client_auth ("require" or "verify_if_given") needs client_ca_arn and lb_tls_passthrough. min_version is "1.3" or "1.2".
  EOT
  type = object({
    certificate_arn = string
    private_key_arn = string
    client_ca_arn   = optional(string)
    client_auth     = optional(string)
    min_version     = optional(string, "1.3")
    admin           = optional(bool, true)
    metrics         = optional(bool, false)
  })
  default = null

  validation {
    condition     = var.tls == null ? true : contains(["1.3", "1.2"], var.tls.min_version)
    error_message = "The tls.min_version must be \"1.3\" or \"1.2\"."
  }

  validation {
    condition     = var.tls == null ? true : (var.tls.client_auth == null ? true : contains(["require", "verify_if_given"], var.tls.client_auth) && var.tls.client_ca_arn != null)
    error_message = "The tls.client_auth must be \"require\" or \"verify_if_given\", and needs tls.client_ca_arn."
  }
}

variable "lb_tls_passthrough" {
  description = "Forward the load balancer's ports as plain TCP so that Tier 2 terminates TLS with var.tls (needed to ask clients for certificates). false (default): the load balancer terminates TLS with certificate_arn (and re-encrypts to the task when var.tls is set). Needs var.tls with admin = true. Changing it, or setting var.tls, replaces the target groups (their protocol changes)."
  type        = bool
  default     = false
}

variable "tier1_tls" {
  description = <<-EOT
    TLS to the Tier 1 routers (config key tier1.tls); their addresses must be https://. ca_arn: PEM bundle of the CA that signed Tier 1's certificates (null: the system roots). certificate_arn and private_key_arn: Tier 2's client certificate for mutual TLS (Tier 1's tls.clientAuth require or verify_if_given), issued by a CA Tier 1 trusts. All are ARNs of Secrets Manager secrets or SSM SecureString parameters holding PEM text, written to /etc/infergate/tls/tier1 like var.tls (same rotation: start new tasks). server_name: the name Tier 1's certificates carry when it differs from the host dialled; min_version: "1.3" or "1.2" (null: Go's default).
  EOT
  type = object({
    ca_arn          = optional(string)
    certificate_arn = optional(string)
    private_key_arn = optional(string)
    server_name     = optional(string)
    min_version     = optional(string)
  })
  default = null

  validation {
    condition     = var.tier1_tls == null ? true : (var.tier1_tls.certificate_arn == null) == (var.tier1_tls.private_key_arn == null)
    error_message = "The tier1_tls.certificate_arn and tier1_tls.private_key_arn go together (the client certificate and its key)."
  }

  validation {
    condition     = var.tier1_tls == null ? true : (var.tier1_tls.min_version == null ? true : contains(["1.3", "1.2"], var.tier1_tls.min_version))
    error_message = "The tier1_tls.min_version must be \"1.3\" or \"1.2\"."
  }
}

variable "tier1_endpoints" {
  description = "Static Tier 1 clusters (the config's clusters: used besides Consul, and as seeds until Consul first answers). address is the base URL Tier 2 dials; cost is in cost_unit (gpu-hour or mtok)."
  type = list(object({
    name      = string
    address   = string
    region    = optional(string)
    models    = optional(list(string), [])
    cost      = optional(number)
    cost_unit = optional(string, "gpu-hour")
    capacity  = optional(number)
  }))
  default = []
}

variable "tier2_config" {
  description = "Extra top-level Tier 2 configuration keys (routing, region_order, jwt, ...), merged over the module's generated configuration; a key given here replaces the generated one whole."
  type        = any
  default     = {}
}

variable "internal" {
  description = "Make the load balancer internal instead of internet-facing."
  type        = bool
  default     = false
}

variable "allowed_cidr_blocks" {
  description = "CIDR blocks allowed to reach the OpenAI API listener (443)."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "admin_cidr_blocks" {
  description = "CIDR blocks allowed to reach the admin API listener. Empty: the admin listener is not reachable through the load balancer."
  type        = list(string)
  default     = []
}

variable "admin_listener_port" {
  description = "Load balancer port of the admin API (TLS)."
  type        = number
  default     = 8443
}

variable "ssl_policy" {
  description = "TLS policy of the listeners."
  type        = string
  default     = "ELBSecurityPolicy-TLS13-1-2-2021-06"
}

variable "container_port" {
  description = "Port of the OpenAI API listener (and /health, /ready) in the container."
  type        = number
  default     = 8080
}

variable "admin_port" {
  description = "Port of the admin API listener in the container."
  type        = number
  default     = 8081
}

variable "metrics_port" {
  description = "Port of the /metrics listener (tenant IDs, token and 429 counts; never on the API port)."
  type        = number
  default     = 9464
}

variable "metrics_scrape_cidrs" {
  description = "CIDRs allowed to scrape /metrics on metrics_port. Empty: /metrics listens on the task's loopback only, for a collector sidecar in the same task."
  type        = list(string)
  default     = []
}

variable "create_ecs_cluster" {
  description = "Create an ECS cluster; false uses ecs_cluster_name."
  type        = bool
  default     = true
}

variable "ecs_cluster_name" {
  description = "Existing ECS cluster to run in when create_ecs_cluster is false."
  type        = string
  default     = null
}

variable "task_cpu" {
  description = "Fargate task CPU units."
  type        = number
  default     = 1024
}

variable "task_memory" {
  description = "Fargate task memory (MiB)."
  type        = number
  default     = 2048
}

variable "cpu_architecture" {
  description = "Fargate CPU architecture: X86_64 or ARM64."
  type        = string
  default     = "X86_64"

  validation {
    condition     = contains(["X86_64", "ARM64"], var.cpu_architecture)
    error_message = "The cpu_architecture must be X86_64 or ARM64."
  }
}

variable "desired_count" {
  description = "Initial number of tasks."
  type        = number
  default     = 2
}

variable "min_capacity" {
  description = "Autoscaling minimum number of tasks."
  type        = number
  default     = 2
}

variable "max_capacity" {
  description = "Autoscaling maximum number of tasks."
  type        = number
  default     = 10
}

variable "cpu_target_percent" {
  description = "Target average CPU utilisation for autoscaling."
  type        = number
  default     = 60
}

variable "config_init_image" {
  description = "Small image with a POSIX shell that writes the configuration file into the task's shared volume before infergate starts."
  type        = string
  default     = "public.ecr.aws/docker/library/busybox:1.36"
}

variable "redis_node_type" {
  description = "ElastiCache node type."
  type        = string
  default     = "cache.r7g.large"
}

variable "redis_engine_version" {
  description = "ElastiCache Redis OSS engine version (7.x: the module uses the default.redis7 parameter groups)."
  type        = string
  default     = "7.1"

  validation {
    condition     = can(regex("^7\\.", var.redis_engine_version))
    error_message = "The redis_engine_version must be a 7.x version."
  }
}

variable "redis_cluster_mode" {
  description = "Enable Redis Cluster mode (sharding). infergate's Redis keys are slot-safe."
  type        = bool
  default     = false
}

variable "redis_num_shards" {
  description = "Shards (node groups) when redis_cluster_mode is true."
  type        = number
  default     = 2
}

variable "redis_replicas_per_shard" {
  description = "Replicas per shard (or of the primary without cluster mode)."
  type        = number
  default     = 1
}

variable "redis_snapshot_retention_days" {
  description = "Days of automatic Redis snapshots (0 disables them)."
  type        = number
  default     = 1
}

variable "log_retention_days" {
  description = "CloudWatch log retention in days."
  type        = number
  default     = 30
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the secrets (when not the AWS managed key); the execution role may decrypt with it."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
