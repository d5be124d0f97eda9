// Package scripts holds remutex's protocol: the Lua scripts that are the
// only code to change a lock's keys. Entry scripts stand at the top of the
// package; the fragments they include stand in lib/, each stating at its
// top what it reads and what it defines.
//
// A line "--#include <file>" of a script is replaced by lib/<file>, itself
// expanded: a fragment is pasted where it stands, so that a slow path's
// helpers come after a script's fast path and an uncontended call never
// builds them. Every redis.call and redis.pcall names its command as a
// literal (TestCommandsLiteral): managed-Redis proxies that vet scripts, and
// Dragonfly, refuse a command name held in a variable.
package scripts

import (
	"embed"
	"io/fs"
	"sort"
	"strings"
)

//go:embed *.lua lib/*.lua
var files embed.FS

const includeDirective = "--#include "

// Source returns the entry script name (without ".lua") with its includes
// expanded. It panics for a script or include that does not exist: the
// scripts are embedded, so that is a mistake in this package.
func Source(name string) string {
	src, err := expand(name+".lua", "", 0)
	if err != nil {
		panic("remutex: " + err.Error())
	}
	return src
}

// Names returns the entry scripts' names, sorted.
func Names() []string { return list(".") }

// Fragments returns the names of lib/'s fragments (with ".lua"), sorted.
func Fragments() []string { return list("lib") }

// Raw returns a script or fragment as written, before its includes are
// expanded: path is "<name>.lua" or "lib/<name>.lua".
func Raw(path string) (string, error) {
	b, err := files.ReadFile(path)
	return string(b), err
}

func list(dir string) []string {
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		panic("remutex: " + err.Error()) // embedded: cannot happen
	}
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".lua"); ok && !e.IsDir() {
			if dir == "lib" {
				name += ".lua"
			}
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// expand returns path with its includes (fragments of lib/) expanded, where
// they stand; depth bounds a fragment that includes itself.
func expand(path, from string, depth int) (string, error) {
	if depth > 8 {
		return "", &IncludeError{File: path, From: from, Why: "includes nest deeper than 8 (a cycle?)"}
	}
	src, err := Raw(path)
	if err != nil {
		return "", &IncludeError{File: path, From: from, Why: "no such file"}
	}
	var out strings.Builder
	for _, line := range strings.SplitAfter(src, "\n") {
		if file, ok := strings.CutPrefix(line, includeDirective); ok {
			s, err := expand("lib/"+strings.TrimSpace(file), path, depth+1)
			if err != nil {
				return "", err
			}
			out.WriteString(s)
			continue
		}
		out.WriteString(line)
	}
	return out.String(), nil
}

// IncludeError says why a script could not be assembled.
type IncludeError struct {
	File, From, Why string
}

func (e *IncludeError) Error() string {
	if e.From == "" {
		return "script " + e.File + ": " + e.Why
	}
	return "script " + e.File + " (included by " + e.From + "): " + e.Why
}
