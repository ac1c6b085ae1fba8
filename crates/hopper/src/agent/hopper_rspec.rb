# hopper's RSpec agent and report formatter, shipped inside the hopper binary.
#
# hopper writes this file to a private temporary directory and runs the
# user's rspec command with `--require` of it.
#
# With HOPPER_RSPEC_AGENT=1 it is the agent: RSpec loads the spec files
# once; instead of running them, this agent serves hopper's agent protocol
# (docs/agent-protocol.md): `run` requests as JSON lines on the original
# stdin, one `result` line per example on the original stdout. The examples'
# own stdout is captured into their results (and goes to stderr between
# examples), and stdin becomes /dev/null, so no example can corrupt or eat
# the protocol.
#
# Otherwise it only defines `HopperRSpecReport`, the formatter batches and
# `--per-process` runs write their report with (`--format HopperRSpecReport
# --out FILE`): RSpec's JSON document, as far as hopper reads it.
#
# Nothing but rspec itself is required here: a library required here is
# loaded into every example, so a spec that uses `Tempfile` or `JSON` without
# requiring it would pass here and fail under plain rspec (hashie 5.0.0's
# did, with `json` and `tempfile`, which loads `delegate`; RSpec's own
# `--format json` loads `json`). So JSON is read and written by hand below.

require 'rspec/core'

# JSON without the `json` library.
module HopperJSON
  ESCAPES = { '"' => '\\"', '\\' => '\\\\', "\n" => '\\n', "\r" => '\\r', "\t" => '\\t' }.freeze
  UNESCAPES = { '"' => '"', '\\' => '\\', '/' => '/', 'b' => "\b", 'f' => "\f", 'n' => "\n", 'r' => "\r",
                't' => "\t" }.freeze

  # A value as JSON: hashes, arrays, strings (made valid UTF-8), integers,
  # floats, true, false and nil.
  def self.json(value)
    case value
    when Hash then "{#{value.map { |k, v| "#{json(k.to_s)}:#{json(v)}" }.join(',')}}"
    when Array then "[#{value.map { |v| json(v) }.join(',')}]"
    when String, Symbol
      text = value.to_s.encode(Encoding::UTF_8, invalid: :replace, undef: :replace)
      escaped = text.scrub.gsub(/["\\\x00-\x1f]/) { |c| ESCAPES[c] || format('\\u%04x', c.ord) }
      "\"#{escaped}\""
    when Integer, true, false then value.to_s
    when Float then value.finite? ? value.to_s : 'null'
    else 'null'
    end
  end

  # A JSON string's body unescaped, \\u escapes and surrogate pairs included.
  def self.unescape(body)
    body.gsub(/\\u(d[89ab]\h\h)\\u(d[c-f]\h\h)|\\u(\h{4})|\\(.)/i) do
      if Regexp.last_match(1)
        high = Regexp.last_match(1).hex
        low = Regexp.last_match(2).hex
        [0x10000 + ((high - 0xd800) << 10) + (low - 0xdc00)].pack('U')
      elsif Regexp.last_match(3)
        [Regexp.last_match(3).hex].pack('U')
      else
        UNESCAPES.fetch(Regexp.last_match(4), Regexp.last_match(4))
      end
    end
  end
end

if ENV['HOPPER_RSPEC_AGENT'] == '1'
  # The capture file is opened by hand, without `tempfile` (see above).
  module HopperRSpecAgent
    PROTOCOL = 1
    OUTPUT_TAIL = Integer(ENV.fetch('HOPPER_OUTPUT_TAIL', '16384'))
    REQUESTS = STDIN.dup
    REPLIES = STDOUT.dup
    REPLIES.sync = true
    STDIN.reopen(File::NULL)
    STDOUT.reopen(STDERR)
    # Where an example's output goes: file descriptor 1 points at this file
    # while the example runs (and at stderr between examples), so what the
    # example and its subprocesses print is in its result, and matchers that
    # reopen $stdout (`output.to_stdout_from_any_process`) work as under
    # plain rspec. Unlinked at once, so nothing is left behind.
    # It sits beside this file, in hopper's private directory.
    capture_path = File.join(File.dirname(File.expand_path(__FILE__)), "stdout-#{Process.pid}")
    CAPTURE = File.open(capture_path, File::RDWR | File::CREAT | File::EXCL | File::TRUNC, 0o600)
    File.unlink(capture_path)
    CAPTURE.sync = true
    # The formatters write to stderr, never into an example's capture.
    RSpec.configuration.output_stream = STDERR if RSpec.configuration.output_stream.equal?(STDOUT)

    def self.reply(message)
      REPLIES.write(json(message) + "\n")
    end

    def self.json(value)
      HopperJSON.json(value)
    end

    # A request: hopper writes one flat JSON object a line, whose values are
    # strings and integers (`{"op":"run","seq":7,"test":"..."}`).
    def self.parse_request(line)
      string = /"((?:[^"\\]|\\.)*)"/
      pairs = line.scan(/#{string}\s*:\s*(?:#{string}|(-?\d+))/)
      raise ArgumentError, "not a request: #{line}" if pairs.empty?

      pairs.to_h { |key, text, number| [HopperJSON.unescape(key), text ? HopperJSON.unescape(text) : Integer(number)] }
    end

    def self.tail(text)
      return text if text.length <= OUTPUT_TAIL
      "[... #{text.length - OUTPUT_TAIL} earlier characters dropped ...]\n" + text[-OUTPUT_TAIL..]
    end

    # An exception as a result's one-line message, and its class, message
    # and the first lines of its backtrace outside rspec and this agent.
    def self.described(error)
      first = error.message.to_s.lines.map(&:strip).reject(&:empty?).first
      trace = (error.backtrace || []).reject { |l| l.include?('/gems/rspec-') || l.include?(__FILE__) }
      [[error.class.name, first].compact.join(': '), "#{error.class}: #{error.message}\n" + trace.first(10).join("\n")]
    end

    # Runs one example through its top-level group, so before/after(:context)
    # hooks and around hooks run as in a normal run; the world's filter
    # shows the group tree only this example.
    def self.run_one(world, example, reporter)
      top = example.example_group.parent_groups.last
      top.descendants.each do |group|
        world.filtered_examples[group] = group.equal?(example.example_group) ? [example] : []
        group.instance_variable_set(:@descendant_filtered_examples, nil)
      end
      example.instance_variable_set(:@exception, nil)
      example.instance_variable_set(:@execution_result, RSpec::Core::Example::ExecutionResult.new)
      CAPTURE.truncate(0)
      CAPTURE.rewind
      STDOUT.flush
      STDOUT.reopen(CAPTURE)
      $stdout = STDOUT
      begin
        top.run(reporter)
      ensure
        $stdout = STDOUT
        STDOUT.flush
        STDOUT.reopen(STDERR)
      end
      CAPTURE.rewind
      [example.execution_result, CAPTURE.read.force_encoding(Encoding::UTF_8).scrub]
    end

    def self.serve(configuration, world, groups)
      examples = {}
      groups.each do |group|
        group.descendants.each { |g| g.filtered_examples.each { |e| examples[e.id] = e } }
      end
      reply(event: 'ready', protocol: PROTOCOL, tests: examples.size)
      configuration.reporter.report(examples.size) do |reporter|
        configuration.with_suite_hooks do
          while (line = REQUESTS.gets)
            request = parse_request(line)
            break if request['op'] == 'exit'
            seq = request['seq']
            reply(event: 'started', seq: seq)
            example = examples[request['test']]
            if example.nil?
              reply(event: 'result', seq: seq, outcome: 'failed', duration_ms: 0,
                    message: "not collected: #{request['test']} is not an example of this rspec run")
              next
            end
            # rspec-retry keeps its failed tries in the example's metadata:
            # those of an earlier run of it are not this run's.
            example.metadata.delete(:retry_exceptions)
            result, output = run_one(world, example, reporter)
            outcome = case result.status
                      when :passed then 'passed'
                      when :pending then 'skipped'
                      else 'failed'
                      end
            error = result.exception
            message = nil
            if error
              message, trace = described(error)
              output = output + "\n" + trace
            end
            answer = { event: 'result', seq: seq, outcome: outcome,
                       duration_ms: ((result.run_time || 0) * 1000).round,
                       message: message, output: tail(output) }
            # A pass after rspec-retry's failed tries is flaky: hopper is told each.
            tries = outcome == 'passed' ? Array(example.metadata[:retry_exceptions]) : []
            unless tries.empty?
              answer[:reruns] = tries.map do |try|
                try_message, try_trace = described(try)
                { message: try_message, output: tail(try_trace) }
              end
            end
            reply(answer)
          end
          true
        end
      end
      # hopper has every example's failure and every error outside one (as
      # `error` events): the protocol's agent exits 0 once it served them.
      0
    end

    # The group whose `after(:context)` hooks run now (nil outside them).
    @context_group = nil
    class << self
      attr_accessor :context_group
    end

    # An error outside any example (docs/agent-protocol.md, `error`): an
    # `after(:context)` hook of the group running it, a suite hook, a spec
    # file that does not load. RSpec counts it as "1 error occurred outside
    # of examples" and fails the run; hopper attaches it to its group.
    def self.outside_error(exception, context_description)
      group = context_group
      phase, where =
        if group && context_description.include?('after(:context)')
          ['after(:context)', group.id]
        elsif (suite = context_description[/(before|after)\(:suite\)/])
          [suite, 'suite']
        elsif (file = context_description[/while loading (\S+?)\.?$/, 1])
          ['collection', file]
        else
          ['outside examples', 'suite']
        end
      first = exception.message.to_s.lines.map(&:strip).reject(&:empty?).first
      trace = (exception.backtrace || []).reject { |l| l.include?('/gems/rspec-') || l.include?(__FILE__) }
      output = "#{context_description}\n#{exception.class}: #{exception.message}\n" + trace.first(20).join("\n")
      reply(event: 'error', group: where, phase: phase,
            message: [exception.class.name, first].compact.join(': '), output: tail(output))
    end

    # Tells hopper of every error RSpec reports outside an example.
    module NonExampleErrors
      def notify_non_example_exception(exception, context_description)
        HopperRSpecAgent.outside_error(exception, context_description)
        super
      end
    end

    # Knows which group's `after(:context)` hooks are running.
    module ContextHooks
      def run_after_context_hooks(example_group_instance)
        HopperRSpecAgent.context_group = self
        super
      ensure
        HopperRSpecAgent.context_group = nil
      end
    end

    # Replaces the run of every example group with the request loop.
    module Runner
      def run_specs(example_groups)
        HopperRSpecAgent.serve(@configuration, @world, example_groups)
      end
    end
  end

  RSpec::Core::Runner.prepend(HopperRSpecAgent::Runner)
  RSpec::Core::Reporter.prepend(HopperRSpecAgent::NonExampleErrors)
  RSpec::Core::ExampleGroup.singleton_class.prepend(HopperRSpecAgent::ContextHooks)
end

# The report of a batch or a `--per-process` run: RSpec's JSON document
# (`--format json`), as far as hopper reads it (`src/verdicts/rspec.rs`):
# each example's id, description, status, place, time, pending message and
# exception, RSpec's messages (its errors outside examples) and the summary.
class HopperRSpecReport
  RSpec::Core::Formatters.register self, :message, :dump_summary, :stop, :close

  def initialize(output)
    @output = output
    @document = { version: RSpec::Core::Version::STRING, messages: [], examples: [] }
  end

  def message(notification)
    @document[:messages] << notification.message
  end

  def stop(notification)
    @document[:examples] = notification.notifications.map { |example| described(example) }
  end

  def dump_summary(summary)
    @document[:summary] = {
      duration: summary.duration, example_count: summary.example_count,
      failure_count: summary.failure_count, pending_count: summary.pending_count,
      errors_outside_of_examples_count: summary.errors_outside_of_examples_count
    }
  end

  def close(_notification)
    @output.write(HopperJSON.json(@document))
  end

  private

  # An example's notification as RSpec's JSON formatter writes it (the
  # backtrace filtered as RSpec shows it).
  def described(notification)
    example = notification.example
    result = example.execution_result
    hash = {
      id: example.id, description: example.description, full_description: example.full_description,
      status: result.status.to_s, file_path: example.metadata[:file_path],
      line_number: example.metadata[:line_number], run_time: result.run_time,
      pending_message: result.pending_message
    }
    error = example.exception
    if error
      hash[:exception] = { class: error.class.name, message: error.message,
                           backtrace: notification.formatted_backtrace }
    end
    hash
  end
end
