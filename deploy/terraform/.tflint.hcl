# tflint configuration for deploy/terraform. Only the terraform ruleset that
# is bundled inside the tflint binary is used, so linting needs no plugin
# download (`tflint --init` is never run). Provider-specific rulesets (aws)
# would need a download and are left out.
config {
  call_module_type = "local"
}

plugin "terraform" {
  enabled = true
  preset  = "all"
}
