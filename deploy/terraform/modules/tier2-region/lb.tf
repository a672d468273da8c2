# A network load balancer terminating TLS with the ACM certificate: 443 for
# the OpenAI API, admin_listener_port for the admin API (reachable only from
# admin_cidr_blocks). Long streaming responses pass through untouched.
resource "aws_lb" "this" {
  name                             = local.short_prefix
  load_balancer_type               = "network"
  internal                         = var.internal
  subnets                          = var.public_subnet_ids
  security_groups                  = [aws_security_group.lb.id]
  enable_cross_zone_load_balancing = true
  tags                             = local.tags
}

resource "aws_lb_target_group" "api" {
  name                 = "${local.short_prefix}-api"
  port                 = var.container_port
  protocol             = "TCP"
  target_type          = "ip"
  vpc_id               = var.vpc_id
  deregistration_delay = 60

  health_check {
    protocol            = "HTTP"
    port                = "traffic-port"
    path                = "/ready"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = local.tags
}

resource "aws_lb_target_group" "admin" {
  name                 = "${local.short_prefix}-adm"
  port                 = var.admin_port
  protocol             = "TCP"
  target_type          = "ip"
  vpc_id               = var.vpc_id
  deregistration_delay = 30

  # The admin listener serves no health endpoint: check the API port.
  health_check {
    protocol            = "HTTP"
    port                = tostring(var.container_port)
    path                = "/ready"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = local.tags
}

resource "aws_lb_listener" "api" {
  load_balancer_arn = aws_lb.this.arn
  port              = 443
  protocol          = "TLS"
  certificate_arn   = var.certificate_arn
  ssl_policy        = var.ssl_policy
  alpn_policy       = "HTTP2Optional"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.api.arn
  }

  tags = local.tags
}

resource "aws_lb_listener" "admin" {
  load_balancer_arn = aws_lb.this.arn
  port              = var.admin_listener_port
  protocol          = "TLS"
  certificate_arn   = var.certificate_arn
  ssl_policy        = var.ssl_policy

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.admin.arn
  }

  tags = local.tags
}
