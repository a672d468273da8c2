package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"gopkg.in/yaml.v3"
)

// repoRoot is the repository root seen from this package's directory.
const repoRoot = "../../.."

// TestDeployDefaultsMatchVersion keeps the image tag the deploy artefacts
// default to equal to what `make image` and the Dockerfile produce: the
// VERSION file. Bumping VERSION without them (or the reverse) fails here.
func TestDeployDefaultsMatchVersion(t *testing.T) {
	version, err := readVersion(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	wantImage := defaultRepository + ":" + version

	t.Run("helm charts", func(t *testing.T) {
		for _, chart := range []string{"infergate-tier1", "infergate-tier2"} {
			dir := filepath.Join(repoRoot, "deploy", "helm", chart)
			var meta struct {
				AppVersion string `yaml:"appVersion"`
			}
			readYAML(t, filepath.Join(dir, "Chart.yaml"), &meta)
			if meta.AppVersion != version {
				t.Errorf("%s/Chart.yaml appVersion = %q, want %q (the VERSION file)", chart, meta.AppVersion, version)
			}
			var values struct {
				Image struct {
					Repository string `yaml:"repository"`
					Tag        string `yaml:"tag"`
				} `yaml:"image"`
			}
			readYAML(t, filepath.Join(dir, "values.yaml"), &values)
			if values.Image.Repository != defaultRepository {
				t.Errorf("%s/values.yaml image.repository = %q, want %q", chart, values.Image.Repository, defaultRepository)
			}
			// An empty tag means the chart's appVersion (the charts' image helper).
			if values.Image.Tag != "" && values.Image.Tag != version {
				t.Errorf("%s/values.yaml image.tag = %q, want \"\" (appVersion) or %q", chart, values.Image.Tag, version)
			}
		}
	})

	t.Run("terraform examples", func(t *testing.T) {
		examples, err := filepath.Glob(filepath.Join(repoRoot, "deploy", "terraform", "examples", "*", "variables.tf"))
		if err != nil || len(examples) == 0 {
			t.Fatalf("no Terraform examples found (%v)", err)
		}
		for _, file := range examples {
			if got := imageVariableDefault(t, file); got != wantImage {
				t.Errorf("%s: variable \"image\" default = %q, want %q", file, got, wantImage)
			}
		}
	})

	// Every other mention of the image with a tag (descriptions, tfvars
	// examples) names the same version.
	t.Run("terraform mentions", func(t *testing.T) {
		mention := regexp.MustCompile(regexp.QuoteMeta(defaultRepository) + `:([A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?)`) // a sentence's full stop is not part of the tag
		root := filepath.Join(repoRoot, "deploy", "terraform")
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".tf") || strings.Contains(path, ".tfvars")) {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range mention.FindAllStringSubmatch(string(b), -1) {
				if m[1] != version {
					t.Errorf("%s names %s, want tag %q", path, m[0], version)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Dockerfile", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
		if err != nil {
			t.Fatal(err)
		}
		args := regexp.MustCompile(`(?m)^ARG VERSION=(\S+)$`).FindAllStringSubmatch(string(b), -1)
		if len(args) == 0 {
			t.Fatal("Dockerfile has no ARG VERSION=<default>")
		}
		for _, m := range args {
			if m[1] != version {
				t.Errorf("Dockerfile ARG VERSION=%s, want %s", m[1], version)
			}
		}
	})
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// imageVariableDefault returns the literal default of variable "image" in a
// Terraform file.
func imageVariableDefault(t *testing.T, path string) string {
	t.Helper()
	f, diags := hclparse.NewParser().ParseHCLFile(path)
	if diags.HasErrors() {
		t.Fatalf("%s: %v", path, diags)
	}
	content, _, diags := f.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "variable", LabelNames: []string{"name"}}}})
	if diags.HasErrors() {
		t.Fatalf("%s: %v", path, diags)
	}
	for _, b := range content.Blocks {
		if b.Labels[0] != "image" {
			continue
		}
		attrs, diags := b.Body.JustAttributes()
		if diags.HasErrors() {
			t.Fatalf("%s: variable \"image\": %v", path, diags)
		}
		def, ok := attrs["default"]
		if !ok {
			t.Fatalf("%s: variable \"image\" has no default", path)
		}
		var v string
		if diags := gohcl.DecodeExpression(def.Expr, nil, &v); diags.HasErrors() {
			t.Fatalf("%s: variable \"image\" default is not a literal string: %v", path, diags)
		}
		return v
	}
	t.Fatalf("%s: no variable \"image\"", path)
	return ""
}
