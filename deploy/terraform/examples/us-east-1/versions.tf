terraform {
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.80"
    }
  }

  # Keep the state remote and encrypted: it holds the Redis AUTH token.
  # backend "s3" {
  #   bucket         = "my-terraform-state"
  #   key            = "infergate/tier2/us-east-1.tfstate"
  #   region         = "us-east-1"
  #   encrypt        = true
  #   dynamodb_table = "terraform-locks"
  # }
}

provider "aws" {
  region = "us-east-1"

  default_tags {
    tags = {
      Project     = "infergate"
      Environment = var.environment
    }
  }
}
