// Package remutexotel records the locks of a remutex Client as
// OpenTelemetry metrics and traces.
package remutexotel
