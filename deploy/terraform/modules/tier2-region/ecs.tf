locals {
  config_dir  = "/etc/infergate"
  config_path = "${local.config_dir}/tier2.yaml"

  environment = [
    { name = "AWS_REGION", value = var.region },
  ]

  secrets = concat(
    [
      { name = "INFERGATE_ADMIN_TOKEN", valueFrom = var.admin_token_secret_arn },
      { name = "INFERGATE_REDIS_PASSWORD", valueFrom = var.redis_auth_token_secret_arn },
    ],
    var.consul_token_secret_arn == null ? [] : [{ name = "CONSUL_HTTP_TOKEN", valueFrom = var.consul_token_secret_arn }],
    var.tier1_token_secret_arn == null ? [] : [{ name = "INFERGATE_TIER1_TOKEN", valueFrom = var.tier1_token_secret_arn }],
  )

  config_init_script = join(" && ", concat(
    ["set -e", "echo \"$INFERGATE_CONFIG_B64\" | base64 -d > ${local.config_path}"],
    length(local.tls_files) == 0 ? [] : concat(
      ["umask 077", "mkdir -p ${local.tls_dir}/tier1"],
      [for f in local.tls_files : format("printf '%%s\\n' \"$%s\" > %s/%s", f.env, local.tls_dir, f.file)],
      ["chown -R 65532:65532 ${local.tls_dir}"],
    ),
  ))

  log_configuration = {
    logDriver = "awslogs"
    options = {
      awslogs-group         = aws_cloudwatch_log_group.this.name
      awslogs-region        = var.region
      awslogs-stream-prefix = "tier2"
    }
  }

  container_definitions = [
    # Fargate has no ConfigMaps: a short-lived container writes the rendered
    # configuration into a task volume that infergate mounts read-only,
    # and the TLS files (var.tls, var.tier1_tls) from the secrets ECS
    # injects into this container only, readable by infergate's user alone.
    merge({
      name       = "config"
      image      = var.config_init_image
      essential  = false
      entryPoint = ["sh", "-c"]
      command    = [local.config_init_script]
      environment = [
        { name = "INFERGATE_CONFIG_B64", value = base64encode(local.config_yaml) },
      ]
      mountPoints      = [{ sourceVolume = "config", containerPath = local.config_dir, readOnly = false }]
      logConfiguration = local.log_configuration
      }, length(local.tls_files) == 0 ? {} : {
      secrets = [for f in local.tls_files : { name = f.env, valueFrom = f.arn }]
    }),
    {
      name                   = "tier2"
      image                  = var.image
      essential              = true
      command                = ["tier2", "--config", local.config_path]
      user                   = "65532:65532"
      readonlyRootFilesystem = true
      portMappings = concat([
        { name = "http", containerPort = var.container_port, protocol = "tcp" },
        { name = "admin", containerPort = var.admin_port, protocol = "tcp" },
        ], length(var.metrics_scrape_cidrs) > 0 ? [
        { name = "metrics", containerPort = var.metrics_port, protocol = "tcp" },
      ] : [])
      environment = local.environment
      secrets     = local.secrets
      mountPoints = [
        { sourceVolume = "config", containerPath = local.config_dir, readOnly = true },
        { sourceVolume = "tmp", containerPath = "/tmp", readOnly = false },
      ]
      dependsOn        = [{ containerName = "config", condition = "SUCCESS" }]
      stopTimeout      = 60
      logConfiguration = local.log_configuration
      linuxParameters  = { initProcessEnabled = true }
    },
  ]
}

resource "aws_ecs_task_definition" "this" {
  family                   = local.prefix
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.task_cpu
  memory                   = var.task_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.task.arn
  container_definitions    = jsonencode(local.container_definitions)

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.cpu_architecture
  }

  volume {
    name = "config"
  }

  volume {
    name = "tmp"
  }

  tags = local.tags
}

resource "aws_ecs_service" "this" {
  name                              = "${var.name}-tier2"
  cluster                           = local.cluster_arn
  task_definition                   = aws_ecs_task_definition.this.arn
  desired_count                     = var.desired_count
  launch_type                       = "FARGATE"
  platform_version                  = "LATEST"
  health_check_grace_period_seconds = 30
  enable_execute_command            = true
  propagate_tags                    = "SERVICE"
  wait_for_steady_state             = false

  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.api.arn
    container_name   = "tier2"
    container_port   = var.container_port
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.admin.arn
    container_name   = "tier2"
    container_port   = var.admin_port
  }

  # Autoscaling owns the task count after creation.
  lifecycle {
    ignore_changes = [desired_count]
  }

  depends_on = [aws_lb_listener.api, aws_lb_listener.admin, aws_iam_role_policy.execution_secrets]

  tags = local.tags
}

resource "aws_appautoscaling_target" "this" {
  service_namespace  = "ecs"
  resource_id        = "service/${local.cluster_name}/${aws_ecs_service.this.name}"
  scalable_dimension = "ecs:service:DesiredCount"
  min_capacity       = var.min_capacity
  max_capacity       = var.max_capacity
}

resource "aws_appautoscaling_policy" "cpu" {
  name               = "${local.prefix}-cpu"
  policy_type        = "TargetTrackingScaling"
  service_namespace  = aws_appautoscaling_target.this.service_namespace
  resource_id        = aws_appautoscaling_target.this.resource_id
  scalable_dimension = aws_appautoscaling_target.this.scalable_dimension

  target_tracking_scaling_policy_configuration {
    target_value       = var.cpu_target_percent
    scale_in_cooldown  = 300
    scale_out_cooldown = 60

    predefined_metric_specification {
      predefined_metric_type = "ECSServiceAverageCPUUtilization"
    }
  }
}
