package testcluster

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

func TestAppYAML(t *testing.T) {
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte(App{Name: "web", Replicas: 2, Node: "agent-1", Ready: true}.YAML()), &d); err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if d.Kind != "Deployment" || d.Name != "web" || *d.Spec.Replicas != 2 || d.Spec.Selector.MatchLabels["app"] != "web" ||
		d.Spec.Template.Labels["app"] != "web" || *d.Spec.Template.Spec.TerminationGracePeriodSeconds != 0 ||
		d.Spec.Template.Spec.NodeSelector["kubernetes.io/hostname"] != "agent-1" ||
		c.Name != "web" || c.Image != TestImage || c.ImagePullPolicy != corev1.PullIfNotPresent || !slices.Equal(c.Args, []string{"serve"}) ||
		c.Ports[0].ContainerPort != 8080 || c.Ports[0].Name != "http" || c.ReadinessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("the Deployment:\n%s", App{Name: "web", Replicas: 2, Node: "agent-1", Ready: true}.YAML())
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict([]byte(App{Kind: "DaemonSet", Name: "everywhere"}.YAML()), &ds); err != nil {
		t.Fatal(err)
	}
	if ds.Kind != "DaemonSet" || ds.Spec.Template.Labels["app"] != "everywhere" || ds.Spec.Template.Spec.Containers[0].ReadinessProbe != nil {
		t.Errorf("the DaemonSet: %+v", ds)
	}
	var p corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(App{Kind: "Pod", Name: "client", Args: []string{"serve", "-listen", ":8081"}}.YAML()), &p); err != nil {
		t.Fatal(err)
	}
	if p.Kind != "Pod" || p.Labels["app"] != "client" || !slices.Equal(p.Spec.Containers[0].Args, []string{"serve", "-listen", ":8081"}) {
		t.Errorf("the Pod: %+v", p)
	}
}
