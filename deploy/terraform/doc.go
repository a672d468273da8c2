// Package terraform has no code: its tests check the Terraform module and
// example roots under this directory offline (see terraform_test.go).
package terraform
