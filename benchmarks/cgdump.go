package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// dumpCost is what one callgrind dump counted: every instruction redis-server
// executed, and the inclusive count of each function it called.
type dumpCost struct {
	total     int64
	inclusive map[string]int64 // by function name, over all its call sites
}

// readDump reads a dump in callgrind's format
// (https://valgrind.org/docs/manual/cl-format.html). Names are compressed:
// "fn=(12) name" defines id 12, a later "cfn=(12)" refers to it. A "calls="
// line is followed by the cost line of that call, inclusive of everything
// the callee ran; summing those per callee gives its inclusive cost. The
// total is the "summary:" line, what callgrind_annotate shows as the
// program's total (the inclusive cost of main and of the threads), or else
// "totals:". (totals, the sum of the costs written, can exceed it by a few
// thousand instructions charged to the frames that were running when the
// counters were zeroed.)
func readDump(path string) (dumpCost, error) {
	f, err := os.Open(path)
	if err != nil {
		return dumpCost{}, err
	}
	defer f.Close()
	d := dumpCost{inclusive: map[string]int64{}}
	names := map[string]string{}
	positions, callee, inCall := 1, "", false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case inCall:
			d.inclusive[callee] += costOf(line, positions)
			inCall = false
		case strings.HasPrefix(line, "calls="):
			inCall = true
		case strings.HasPrefix(line, "fn="):
			nameOf(line[len("fn="):], names)
		case strings.HasPrefix(line, "cfn="):
			callee = nameOf(line[len("cfn="):], names)
		case strings.HasPrefix(line, "positions:"):
			positions = len(strings.Fields(line)) - 1
		case strings.HasPrefix(line, "summary:"), strings.HasPrefix(line, "totals:") && d.total == 0:
			_, v, _ := strings.Cut(line, ":")
			if d.total, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil {
				return dumpCost{}, fmt.Errorf("%s: %q: %w", path, line, err)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return dumpCost{}, err
	}
	return d, nil
}

// nameOf resolves a compressed name "(id) name" or "(id)", recording the
// definitions in names.
func nameOf(s string, names map[string]string) string {
	if !strings.HasPrefix(s, "(") {
		return s
	}
	id, name, defined := strings.Cut(s, ") ")
	if defined {
		names[id] = name
		return name
	}
	return names[strings.TrimSuffix(s, ")")]
}

// costOf returns the instructions of a cost line: the first event after the
// positions (the only event counted); a line that leaves it out costs 0.
func costOf(line string, positions int) int64 {
	f := strings.Fields(line)
	if len(f) <= positions {
		return 0
	}
	n, _ := strconv.ParseInt(f[positions], 10, 64)
	return n
}
