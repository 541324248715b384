package exampleserver

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Resource URIs and texts the conformance suite looks for.
const (
	staticTextURI   = "test://static-text"
	staticTextBody  = "This is the content of the static text resource."
	staticBinaryURI = "test://static-binary"
	watchedURI      = "test://watched-resource"
	watchedBody     = "Watched resource content"
	templateURI     = "test://template/{id}/data"
)

// templateID extracts {id} from a URI matching templateURI.
var templateID = regexp.MustCompile(`^test://template/([^/]+)/data$`)

func addResources(srv *mcp.Server) {
	fixed := func(contents *mcp.ResourceContents) mcp.ResourceHandler {
		return func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{contents}}, nil
		}
	}
	srv.AddResource(&mcp.Resource{
		URI: staticTextURI, Name: "static-text", MIMEType: "text/plain",
		Description: "A static text resource.",
	}, fixed(&mcp.ResourceContents{URI: staticTextURI, MIMEType: "text/plain", Text: staticTextBody}))
	srv.AddResource(&mcp.Resource{
		URI: staticBinaryURI, Name: "static-binary", MIMEType: "image/png",
		Description: "A static binary resource: a 1x1 red PNG.",
	}, fixed(&mcp.ResourceContents{URI: staticBinaryURI, MIMEType: "image/png", Blob: redPixelPNG}))
	srv.AddResource(&mcp.Resource{
		URI: watchedURI, Name: "watched-resource", MIMEType: "text/plain",
		Description: "A resource clients may subscribe to.",
	}, fixed(&mcp.ResourceContents{URI: watchedURI, MIMEType: "text/plain", Text: watchedBody}))

	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: templateURI, Name: "template", MIMEType: "application/json",
		Description: "A resource template: test://template/{id}/data returns JSON naming the id.",
	}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		m := templateID.FindStringSubmatch(req.Params.URI)
		if m == nil {
			return nil, mcp.ResourceNotFoundError(req.Params.URI)
		}
		body, err := json.Marshal(struct {
			ID           string `json:"id"`
			TemplateTest bool   `json:"templateTest"`
			Data         string `json:"data"`
		}{m[1], true, "Data for ID: " + m[1]})
		if err != nil {
			return nil, fmt.Errorf("encoding template resource: %w", err)
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{
			URI: req.Params.URI, MIMEType: "application/json", Text: string(body),
		}}}, nil
	})
}

// subscribe accepts subscriptions to the server's fixed resources; the SDK
// records them. No updates are sent on its own (see the package doc).
func subscribe(_ context.Context, req *mcp.SubscribeRequest) error {
	return knownResource(req.Params.URI)
}

func unsubscribe(_ context.Context, req *mcp.UnsubscribeRequest) error {
	return knownResource(req.Params.URI)
}

func knownResource(uri string) error {
	switch uri {
	case staticTextURI, staticBinaryURI, watchedURI:
		return nil
	}
	if templateID.MatchString(uri) {
		return nil
	}
	return mcp.ResourceNotFoundError(uri)
}

func addPrompts(srv *mcp.Server) {
	user := func(c mcp.Content) *mcp.PromptMessage { return &mcp.PromptMessage{Role: "user", Content: c} }

	srv.AddPrompt(&mcp.Prompt{
		Name: "test_simple_prompt", Description: "A simple prompt without arguments.",
	}, func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{
			user(&mcp.TextContent{Text: "This is a simple prompt for testing."}),
		}}, nil
	})

	srv.AddPrompt(&mcp.Prompt{
		Name: "test_prompt_with_arguments", Description: "A prompt with two required arguments.",
		Arguments: []*mcp.PromptArgument{
			{Name: "arg1", Description: "First test argument", Required: true},
			{Name: "arg2", Description: "Second test argument", Required: true},
		},
	}, func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		a := req.Params.Arguments
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{
			user(&mcp.TextContent{Text: fmt.Sprintf("Prompt with arguments: arg1='%s', arg2='%s'", a["arg1"], a["arg2"])}),
		}}, nil
	})

	srv.AddPrompt(&mcp.Prompt{
		Name: "test_prompt_with_embedded_resource", Description: "A prompt that embeds a resource.",
		Arguments: []*mcp.PromptArgument{
			{Name: "resourceUri", Description: "URI of the resource to embed", Required: true},
		},
	}, func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{
			user(&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
				URI: req.Params.Arguments["resourceUri"], MIMEType: "text/plain", Text: "Embedded resource content for testing.",
			}}),
			user(&mcp.TextContent{Text: "Please process the embedded resource above."}),
		}}, nil
	})

	srv.AddPrompt(&mcp.Prompt{
		Name: "test_prompt_with_image", Description: "A prompt that contains an image.",
	}, func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{
			user(&mcp.ImageContent{Data: redPixelPNG, MIMEType: "image/png"}),
			user(&mcp.TextContent{Text: "Please analyze the image above."}),
		}}, nil
	})
}

// completions lists the candidate values per (reference, argument); complete
// returns those that start with the typed prefix.
var completions = map[[2]string][]string{
	{"ref/prompt:test_prompt_with_arguments", "arg1"}: {"paris", "park", "party"},
	{"ref/prompt:test_prompt_with_arguments", "arg2"}: {"hello", "world"},
	{"ref/resource:" + templateURI, "id"}:             {"1", "2", "3", "123"},
}

func complete(_ context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	ref := req.Params.Ref
	key := ref.Type + ":" + ref.Name
	if ref.Type == "ref/resource" {
		key = ref.Type + ":" + ref.URI
	}
	values := []string{} // never null: the suite requires an array
	for _, v := range completions[[2]string{key, req.Params.Argument.Name}] {
		if strings.HasPrefix(v, req.Params.Argument.Value) {
			values = append(values, v)
		}
	}
	return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: values, Total: len(values)}}, nil
}
