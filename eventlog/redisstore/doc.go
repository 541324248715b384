// Package redisstore provides an eventlog.Store on Redis, shared by relay
// replicas.
package redisstore
