terraform {
  # Tested with Terraform 1.5.7 (the last MPL-2.0 release).
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.80"
    }
  }
}
