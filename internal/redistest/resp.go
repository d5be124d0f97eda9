package redistest

import (
	"bytes"
	"strconv"
)

// RESP as a FaultProxy reads it: where a request or a reply ends, and
// what a request's arguments are.

var crlf = []byte("\r\n")

// parseRequest parses the request at the start of b: a RESP array of bulk
// strings, or an inline command (a line of words). It returns its arguments
// (none for an empty one) and its length; n is 0 when b holds only part of
// it, and ok false when b does not start with a request.
func parseRequest(b []byte) (args [][]byte, n int, ok bool) {
	if len(b) == 0 {
		return nil, 0, true
	}
	if b[0] != '*' {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return nil, 0, len(b) < 64<<10
		}
		return bytes.Fields(b[:i]), i + 1, true
	}
	count, i, ok := intLine(b, 1)
	if !ok || i == 0 || count <= 0 {
		return nil, i, ok
	}
	args = make([][]byte, 0, min(count, 64))
	for range count {
		if i >= len(b) {
			return nil, 0, true
		}
		if b[i] != '$' {
			return nil, 0, false
		}
		size, j, ok := intLine(b, i+1)
		switch {
		case !ok || size < 0:
			return nil, 0, false
		case j == 0 || j+size+2 > len(b):
			return nil, 0, true
		case !bytes.Equal(b[j+size:j+size+2], crlf):
			return nil, 0, false
		}
		args = append(args, b[j:j+size])
		i = j + size + 2
	}
	return args, i, true
}

// replyLen returns the length of the RESP2 or RESP3 value at the start of b
// (an attribute together with the value it describes); 0 when b holds only
// part of it, and ok false when b does not start with one.
func replyLen(b []byte) (n int, ok bool) { return valueEnd(b, 0, 0) }

func valueEnd(b []byte, i, depth int) (end int, ok bool) {
	if i >= len(b) {
		return 0, true
	}
	if depth > 64 {
		return 0, false
	}
	switch b[i] {
	case '+', '-', ':', '_', ',', '#', '(':
		j := bytes.Index(b[i:], crlf)
		if j < 0 {
			return 0, true
		}
		return i + j + 2, true
	case '$', '!', '=':
		size, j, ok := intLine(b, i+1)
		switch {
		case !ok || j == 0:
			return 0, ok
		case size < 0:
			return j, true
		case j+size+2 > len(b):
			return 0, true
		}
		return j + size + 2, true
	case '*', '~', '>', '%', '|':
		count, j, ok := intLine(b, i+1)
		if !ok || j == 0 || count < 0 {
			return j, ok
		}
		if b[i] == '%' || b[i] == '|' {
			count *= 2
		}
		for range count {
			if j, ok = valueEnd(b, j, depth+1); !ok || j == 0 {
				return 0, ok
			}
		}
		if b[i] == '|' {
			return valueEnd(b, j, depth+1)
		}
		return j, true
	}
	return 0, false
}

// intLine parses the integer from b[i] to the end of its line: its value
// and where the next line starts; next is 0 when the line is not complete,
// ok false when it is no integer.
func intLine(b []byte, i int) (v, next int, ok bool) {
	j := bytes.Index(b[i:], crlf)
	if j < 0 {
		return 0, 0, len(b)-i < 32
	}
	v, err := strconv.Atoi(string(b[i : i+j]))
	if err != nil {
		return 0, 0, false
	}
	return v, i + j + 2, true
}

// containsFold reports whether s contains lower, which is in lower case,
// ignoring ASCII case.
func containsFold(s, lower []byte) bool {
	for i := 0; i+len(lower) <= len(s); i++ {
		match := true
		for j, c := range lower {
			d := s[i+j]
			if 'A' <= d && d <= 'Z' {
				d += 'a' - 'A'
			}
			if d != c {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}
