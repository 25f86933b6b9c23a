package testcluster

import (
	"fmt"
	"strconv"
	"strings"
)

// App is the manifest of the test app (TestImage): a Deployment, DaemonSet
// or Pod named Name, whose pods are labelled app: Name and have one
// container, also named Name, that runs testapp with Args. Its pods go at
// once when deleted.
//
//	App{Name: "web", Replicas: 2, Ready: true}.YAML()
type App struct {
	Kind     string   // Deployment (when empty), DaemonSet or Pod
	Name     string   // of the workload, its pods' app label and container
	Replicas int      // of a Deployment; 1 when 0
	Args     []string // testapp's arguments; serve when empty
	Node     string   // the only node (kubernetes.io/hostname) its pods may run on
	Ready    bool     // port 8080, named http, and Ready once /healthz answers
}

// YAML is the app's manifest, to apply as it is or joined to others by
// "---".
func (a App) YAML() string {
	args := a.Args
	if len(args) == 0 {
		args = []string{"serve"}
	}
	quoted := make([]string, len(args))
	for i, arg := range args {
		quoted[i] = strconv.Quote(arg)
	}
	pod := "terminationGracePeriodSeconds: 0\n"
	if a.Node != "" {
		pod += "nodeSelector: {kubernetes.io/hostname: " + a.Node + "}\n"
	}
	pod += fmt.Sprintf("containers:\n- name: %s\n  image: %s\n  imagePullPolicy: IfNotPresent\n  args: [%s]\n", a.Name, TestImage, strings.Join(quoted, ", "))
	if a.Ready {
		pod += "  ports: [{containerPort: 8080, name: http}]\n  readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}\n"
	}
	if a.Kind == "Pod" {
		return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %[1]s, labels: {app: %[1]s}}\nspec:\n%[2]s", a.Name, indent(pod, "  "))
	}
	kind, replicas := a.Kind, ""
	if kind == "" {
		kind = "Deployment"
	}
	if kind == "Deployment" {
		replicas = fmt.Sprintf("  replicas: %d\n", max(a.Replicas, 1))
	}
	return fmt.Sprintf("apiVersion: apps/v1\nkind: %[1]s\nmetadata: {name: %[2]s}\nspec:\n%[3]s  selector: {matchLabels: {app: %[2]s}}\n  template:\n    metadata: {labels: {app: %[2]s}}\n    spec:\n%[4]s",
		kind, a.Name, replicas, indent(pod, "      "))
}

// indent puts prefix before every line of text.
func indent(text, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimSuffix(text, "\n"), "\n", "\n"+prefix) + "\n"
}
