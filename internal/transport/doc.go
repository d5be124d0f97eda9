// Package transport is the backend of remutex: one Redis deployment (the
// calls of the lock scripts, their batching, the quick path, NOSCRIPT,
// WAIT, dialling, pub/sub) and the quorum of several. It is built from a
// config and never sees the root package's Client or any of its public
// types; the root re-exports the errors it returns (see errors.go), so
// that errors.Is sees one identity.
package transport
