//go:build race && unix

package main

// Under the race detector the binary under test is built with it too.
func init() { buildFlags = append(buildFlags, "-race") }
