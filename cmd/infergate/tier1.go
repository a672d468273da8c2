package main

import (
	"context"
	"errors"
	"flag"
	"io"
)

func runTier1(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tier1", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return errors.New("not implemented yet")
}
