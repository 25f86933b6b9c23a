// Package token reads and writes kelp's join tokens. The full form,
// KELP1<ca-sha256>::<user>:<secret>, carries the hash of the cluster CA,
// so a joining node can check the server's certificates before it trusts
// anything the server says; the short form is the secret alone, and then
// the CA is trusted on first use.
package token
