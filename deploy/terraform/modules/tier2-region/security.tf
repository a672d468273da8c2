resource "aws_security_group" "lb" {
  name        = "${local.prefix}-lb"
  description = "infergate Tier 2 load balancer"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${local.prefix}-lb" })
}

resource "aws_vpc_security_group_ingress_rule" "lb_api" {
  for_each          = toset(var.allowed_cidr_blocks)
  security_group_id = aws_security_group.lb.id
  description       = "OpenAI API (TLS)"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_ingress_rule" "lb_admin" {
  for_each          = toset(var.admin_cidr_blocks)
  security_group_id = aws_security_group.lb.id
  description       = "Admin API (TLS)"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = var.admin_listener_port
  to_port           = var.admin_listener_port
}

resource "aws_vpc_security_group_egress_rule" "lb_to_tasks_api" {
  security_group_id            = aws_security_group.lb.id
  description                  = "To the Tier 2 tasks (API and health checks)"
  referenced_security_group_id = aws_security_group.tasks.id
  ip_protocol                  = "tcp"
  from_port                    = var.container_port
  to_port                      = var.container_port
}

resource "aws_vpc_security_group_egress_rule" "lb_to_tasks_admin" {
  security_group_id            = aws_security_group.lb.id
  description                  = "To the Tier 2 tasks (admin API)"
  referenced_security_group_id = aws_security_group.tasks.id
  ip_protocol                  = "tcp"
  from_port                    = var.admin_port
  to_port                      = var.admin_port
}

resource "aws_security_group" "tasks" {
  name        = "${local.prefix}-tasks"
  description = "infergate Tier 2 ECS tasks"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${local.prefix}-tasks" })
}

resource "aws_vpc_security_group_ingress_rule" "tasks_api" {
  security_group_id            = aws_security_group.tasks.id
  description                  = "OpenAI API and health checks from the load balancer"
  referenced_security_group_id = aws_security_group.lb.id
  ip_protocol                  = "tcp"
  from_port                    = var.container_port
  to_port                      = var.container_port
}

resource "aws_vpc_security_group_ingress_rule" "tasks_admin" {
  security_group_id            = aws_security_group.tasks.id
  description                  = "Admin API from the load balancer"
  referenced_security_group_id = aws_security_group.lb.id
  ip_protocol                  = "tcp"
  from_port                    = var.admin_port
  to_port                      = var.admin_port
}

resource "aws_vpc_security_group_ingress_rule" "tasks_metrics" {
  for_each          = toset(var.metrics_scrape_cidrs)
  security_group_id = aws_security_group.tasks.id
  description       = "Prometheus scrapes of /metrics"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = var.metrics_port
  to_port           = var.metrics_port
}

# Tier 1 routers, Consul, Secrets Manager, ECR and CloudWatch live outside
# this module: the tasks may connect out anywhere.
resource "aws_vpc_security_group_egress_rule" "tasks_all" {
  security_group_id = aws_security_group.tasks.id
  description       = "Outbound to Tier 1, Consul, Redis and AWS APIs"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
}

resource "aws_security_group" "redis" {
  name        = "${local.prefix}-redis"
  description = "infergate Tier 2 ElastiCache"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${local.prefix}-redis" })
}

resource "aws_vpc_security_group_ingress_rule" "redis_from_tasks" {
  security_group_id            = aws_security_group.redis.id
  description                  = "Redis (TLS) from the Tier 2 tasks"
  referenced_security_group_id = aws_security_group.tasks.id
  ip_protocol                  = "tcp"
  from_port                    = local.redis_port
  to_port                      = local.redis_port
}
