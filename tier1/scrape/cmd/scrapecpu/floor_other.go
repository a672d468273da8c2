//go:build !linux

package main

import "log"

func floorCmd([]string) { log.Fatal("scrapecpu floor: Linux only") }
