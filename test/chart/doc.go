// Package chart holds the test that keeps the Helm chart (charts/cistern) and the kustomize
// install (deploy/csi) one install: both rendered, their objects compared. It is its own module
// so that the main module does not link helm.
package chart
