import { Template } from '@huggingface/jinja';
import { InvalidArgumentError } from '../errors.ts';

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'developer' | 'tool';
  content: string;
}

/**
 * The prompt of a chat when the model's tokenizer_config.json has no `chat_template`: each
 * message on its own lines as `<role>: <content>`, then `assistant:` for the model to go on.
 * The text `\nuser:` stops the answer, so that the model does not write the user's next turn.
 */
export const DEFAULT_CHAT_TEMPLATE = '{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:';
export const DEFAULT_CHAT_STOPS = ['\nuser:'];

/** A chat template compiled once: renders messages into the prompt text. */
export class ChatFormat {
  private readonly template: Template;
  readonly stops: readonly string[];

  /** `source`: the model's Jinja chat template, or null for DEFAULT_CHAT_TEMPLATE. */
  constructor(
    source: string | null,
    private readonly specials: { bos_token?: string; eos_token?: string } = {},
  ) {
    try {
      this.template = new Template(source ?? DEFAULT_CHAT_TEMPLATE);
    } catch (cause) {
      throw new InvalidArgumentError(`the model's chat template could not be read: ${(cause as Error).message}`, { cause });
    }
    this.stops = source === null ? DEFAULT_CHAT_STOPS : [];
  }

  render(messages: readonly ChatMessage[]): string {
    try {
      return this.template.render({ messages, add_generation_prompt: true, bos_token: '', eos_token: '', ...this.specials });
    } catch (cause) {
      throw new InvalidArgumentError(`the chat template failed on these messages: ${(cause as Error).message}`, { cause });
    }
  }
}
