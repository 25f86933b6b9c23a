// Package nodeevent records Events on a Node for what kelp does on that
// machine outside any controller, such as its snapshots, so that a
// failure shows in kubectl describe node and kubectl get events, not only
// in a log on the machine.
package nodeevent
