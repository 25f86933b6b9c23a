// Package logging sets up kelp's logrus output and routes klog, which every
// upstream Kubernetes component logs through, into it.
package logging
