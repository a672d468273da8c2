# A network load balancer: 443 for the OpenAI API, admin_listener_port for
# the admin API (reachable only from admin_cidr_blocks). It terminates TLS
# with the ACM certificate and forwards plain TCP, or, with var.tls,
# re-encrypts to Tier 2's own TLS; with var.lb_tls_passthrough it forwards
# TCP untouched and Tier 2 terminates TLS (client certificates possible).
# Long streaming responses pass through untouched.
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
  protocol             = local.api_target_protocol
  target_type          = "ip"
  vpc_id               = var.vpc_id
  deregistration_delay = 60

  health_check {
    protocol            = local.health_check_protocol
    port                = "traffic-port"
    path                = local.health_check_protocol == "TCP" ? null : "/ready"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = local.tags
}

resource "aws_lb_target_group" "admin" {
  name                 = "${local.short_prefix}-adm"
  port                 = var.admin_port
  protocol             = local.adm_target_protocol
  target_type          = "ip"
  vpc_id               = var.vpc_id
  deregistration_delay = 30

  # The admin listener serves no health endpoint: check the API port.
  health_check {
    protocol            = local.health_check_protocol
    port                = tostring(var.container_port)
    path                = local.health_check_protocol == "TCP" ? null : "/ready"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = local.tags
}

resource "aws_lb_listener" "api" {
  load_balancer_arn = aws_lb.this.arn
  port              = 443
  protocol          = local.lb_listener_protocol
  certificate_arn   = var.lb_tls_passthrough ? null : var.certificate_arn
  ssl_policy        = var.lb_tls_passthrough ? null : var.ssl_policy
  alpn_policy       = var.lb_tls_passthrough ? null : "HTTP2Optional"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.api.arn
  }

  lifecycle {
    precondition {
      condition     = !var.lb_tls_passthrough || var.tls != null
      error_message = "lb_tls_passthrough needs var.tls: Tier 2 must terminate TLS itself."
    }
    precondition {
      condition     = var.tls == null ? true : (var.tls.client_auth == null || var.lb_tls_passthrough)
      error_message = "tls.client_auth needs lb_tls_passthrough: a load balancer terminating TLS has no client certificate to show Tier 2."
    }
  }

  tags = local.tags
}

resource "aws_lb_listener" "admin" {
  load_balancer_arn = aws_lb.this.arn
  port              = var.admin_listener_port
  protocol          = local.lb_listener_protocol
  certificate_arn   = var.lb_tls_passthrough ? null : var.certificate_arn
  ssl_policy        = var.lb_tls_passthrough ? null : var.ssl_policy

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.admin.arn
  }

  lifecycle {
    precondition {
      condition     = !var.lb_tls_passthrough || local.tls_admin
      error_message = "lb_tls_passthrough needs tls.admin = true: the admin API would otherwise cross the network in plain text."
    }
  }

  tags = local.tags
}
