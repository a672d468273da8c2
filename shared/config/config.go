// Package config decodes infergate's YAML configuration files strictly:
// an unknown field is an error that names the field and its line.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"gopkg.in/yaml.v3"
)

// Validator is implemented by configuration types that can check themselves
// after defaults are applied.
type Validator interface {
	Validate() error
}

// Defaulter is implemented by configuration types that fill in zero fields.
type Defaulter interface {
	SetDefaults()
}

// Decode strictly decodes YAML data into v, then applies defaults and
// validates when v implements Defaulter or Validator. name is used in error
// messages (usually the file path).
func Decode(name string, data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w", name, err)
	}
	if d, ok := v.(Defaulter); ok {
		d.SetDefaults()
	}
	if val, ok := v.(Validator); ok {
		if err := val.Validate(); err != nil {
			return fmt.Errorf("%s: invalid configuration: %w", name, err)
		}
	}
	return nil
}

// Load reads the file at path and decodes it with Decode.
func Load(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	return Decode(path, data, v)
}
