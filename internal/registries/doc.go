// Package registries reads /etc/kelp/registries.yaml (mirrors, auth and
// TLS per registry, the k3s format) and renders it into containerd's hosts
// configuration.
package registries
