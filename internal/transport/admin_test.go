package transport

import "testing"

func TestGlobEscape(t *testing.T) {
	if got, want := globEscape(`a*b?c[d]e\f`), `a\*b\?c\[d\]e\\f`; got != want {
		t.Errorf("globEscape: got %q, want %q", got, want)
	}
}
